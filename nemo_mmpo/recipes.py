"""Load a recipe and its overrides exactly as NeMo-RL's ``examples/run_grpo.py`` will.

NeMo-RL's ``run_grpo.py`` does: ``load_config(path)`` (its ``defaults:`` inheritance),
``parse_hydra_overrides(config, overrides)`` (Hydra's override grammar: ``key=v``, ``+key=v``,
``++key=v``, ``~key``, ``~key=v``), then ``OmegaConf.to_container(config, resolve=True)``
with its resolvers registered. :func:`load` runs those same functions:

- NeMo-RL's own ``nemo_rl.utils.config`` when it is importable, else the same file read from
  the NeMo-RL checkout (``NEMO_RL_PATH``, or the container's ``/opt/nemo-rl``): it needs only
  OmegaConf and Hydra, so a login node without torch validates with NeMo-RL's own code;
- with no checkout at all, the same libraries (OmegaConf merges, Hydra's override parser)
  driven here; a recipe that inherits NeMo-RL's configs is then refused, not half-validated.

A recipe's ``defaults:`` entries name files by a scheme that does not depend on where the
recipe lives (:func:`resolve_default`): ``nemo_rl/<file>`` is a file of the NeMo-RL checkout
the run uses (its ``examples/configs``), ``base/<file>`` and ``nemo_mmpo/<file>`` files of
this package's recipes (package data, ``nemo_mmpo/configs``: the same names from a clone and
from an installed wheel), an absolute path itself, anything else a path relative to
the file that names it (NeMo-RL's own rule, which NeMo-RL's configs keep: inside the checkout
nothing is renamed). :func:`compose` merges them with NeMo-RL's own ``merge_with_override``
into one config without ``defaults:`` (:attr:`LoadedConfig.composed`); NeMo-RL's
``load_config`` then reads that text from a file, as its ``run_grpo.py`` reads the same text
from the run's folder (:func:`write_run_record`), so the trainer reads what the dry run checked.

A config that does not resolve (a missing base, a broken interpolation) is an error: nothing
is validated on an unresolved config.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import importlib.util
import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from nemo_mmpo.checkout import CONFIGS_DIR, find_nemo_rl_root
from nemo_mmpo.errors import MMPOInputError, install_command
from nemo_mmpo.io import write_text_atomic

LAUNCH_EXTRA = (
    "hydra-core 1.3, omegaconf 2.3 and antlr4-python3-runtime 4.9.3 (NeMo-RL's lock): "
    + install_command("launch")
)


@dataclass(frozen=True)
class LoadedConfig:
    """A resolved config (plain dicts and lists), where it came from and how it was read."""

    config: dict[str, Any]
    source: Path
    overrides: tuple[str, ...] = ()
    loader: str = ""
    #: the recipe and its bases merged, before overrides (YAML, interpolations kept): the text
    #: NeMo-RL's ``load_config`` read, and the file :func:`write_run_record` hands its trainer
    composed: str = ""
    #: the NeMo-RL checkout whose configs ``nemo_rl/`` named (None: none was found)
    nemo_rl_root: Path | None = None
    #: the recipe the run was started from, when ``source`` is a run's record (or a checkpoint's)
    recipe: Path | None = None

    def to_yaml(self) -> str:
        from omegaconf import OmegaConf

        return OmegaConf.to_yaml(OmegaConf.create(self.config))


def _requirements_missing(error: ImportError) -> MMPOInputError:
    return MMPOInputError(f"reading a recipe needs {LAUNCH_EXTRA} ({error})")


def nemo_rl_config_module(nemo_rl_root: Path | None) -> tuple[ModuleType | None, str]:
    """NeMo-RL's ``nemo_rl.utils.config`` (imported, or read from the checkout), and a label."""
    try:
        module = importlib.import_module("nemo_rl.utils.config")
        return module, f"NeMo-RL's loader ({Path(module.__file__).parents[2]})"
    except ModuleNotFoundError as error:
        if error.name not in ("nemo_rl", "nemo_rl.utils", "nemo_rl.utils.config"):
            raise _requirements_missing(error) from None
    except ImportError as error:
        raise _requirements_missing(error) from None
    if nemo_rl_root is None:
        return None, ""
    source = nemo_rl_root / "nemo_rl" / "utils" / "config.py"
    spec = importlib.util.spec_from_file_location("nemo_mmpo_nemo_rl_config", source)
    if spec is None or spec.loader is None or not source.is_file():
        return None, ""
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as error:
        raise _requirements_missing(error) from None
    return module, f"NeMo-RL's loader, read from {source} (nemo_rl is not importable here)"


#: ``defaults:`` prefixes naming a folder wherever the recipe lives: NeMo-RL's configs (the
#: checkout the run uses), ours (this package's ``configs``; ``base/`` is short for
#: ``nemo_mmpo/base/``)
NEMO_RL_PREFIX, OURS_PREFIX, BASE_PREFIX = "nemo_rl", "nemo_mmpo", "base"
#: what a run's record (:func:`write_run_record`) starts with: the line saying how it started
RECORD_HEADER = "# nemo-mmpo run: "
#: the run's record, in its ``checkpointing.checkpoint_dir`` beside NeMo-RL's ``step_<N>``
RECORD_NAME = "nemo_mmpo_recipe.yaml"


def packaged(entry: str) -> Path | None:
    """The file of nemo-mmpo's recipes that ``nemo_mmpo/<file>`` (or ``base/<file>``) names,
    None for any other entry."""
    first, _, rest = entry.partition("/")
    if first == OURS_PREFIX and rest:
        return CONFIGS_DIR / rest
    if first == BASE_PREFIX and rest:
        return CONFIGS_DIR / entry
    return None


def resolve_default(entry: str, including: Path, nemo_rl_root: Path | None) -> Path:
    """The file a ``defaults:`` entry of ``including`` names (see the module's docstring)."""
    if entry.startswith("/"):
        return Path(entry)
    if nemo_rl_root is not None and including.resolve().is_relative_to(nemo_rl_root.resolve()):
        return including.parent / entry  # NeMo-RL's own configs: its rule, unchanged
    first, _, rest = entry.partition("/")
    if first == NEMO_RL_PREFIX and rest:
        if nemo_rl_root is None:
            raise MMPOInputError(
                f"config {str(including)!r} inherits {entry}, a NeMo-RL config, and no NeMo-RL "
                "checkout was found. Recipes inherit NeMo-RL's configs: set NEMO_RL_PATH to a "
                "NeMo-RL checkout (on a login node too) so that they resolve"
            )
        return nemo_rl_root / "examples" / "configs" / rest
    return packaged(entry) or including.parent / entry


def compose(
    path: Path,
    nemo_rl_root: Path | None,
    merge: Callable[[Any, Any], Any],
    _chain: tuple[Path, ...] = (),
) -> Any:
    """``path`` merged over its ``defaults:`` (depth first, later entries winning), as NeMo-RL's
    ``load_config_with_inheritance`` merges, each entry found by :func:`resolve_default`."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if path.resolve() in _chain:
        cycle = " -> ".join(str(item) for item in (*_chain, path.resolve()))
        raise MMPOInputError(f"config {str(path)!r} inherits itself: {cycle}")
    if not path.is_file():
        raise FileNotFoundError(2, "No such file", str(path))
    config = OmegaConf.load(path)
    if not isinstance(config, DictConfig):
        raise MMPOInputError(f"config {path} must be a mapping at the top level")
    if "defaults" not in config:
        return config
    defaults = config.pop("defaults")
    if isinstance(defaults, (str, Path)):
        defaults = [defaults]
    elif isinstance(defaults, ListConfig):
        defaults = [str(entry) for entry in defaults]
    merged = OmegaConf.create({})
    for entry in defaults:
        parent = resolve_default(str(entry), path, nemo_rl_root)
        merged = merge(merged, compose(parent, nemo_rl_root, merge, (*_chain, path.resolve())))
    return merge(merged, config)


def _merge(base: Any, override: Any) -> Any:
    from omegaconf import DictConfig, OmegaConf

    for key in list(override.keys()):
        section = override[key]
        if isinstance(section, DictConfig) and section.get("_override_", False):
            section.pop("_override_")
            if key in base:
                base.pop(key)
    return OmegaConf.merge(base, override)


def _apply_overrides(config: Any, overrides: Sequence[str]) -> Any:
    """Hydra's override grammar on a struct config (what NeMo-RL's parser does)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    OmegaConf.set_struct(config, True)
    parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
    ConfigLoaderImpl._apply_overrides_to_config(overrides=parsed, cfg=config)
    return config


def _register_resolvers(module: ModuleType | None) -> None:
    """NeMo-RL's resolvers (its own registration function when there is one)."""
    from omegaconf import OmegaConf

    if module is not None and hasattr(module, "register_omegaconf_resolvers"):
        module.register_omegaconf_resolvers()
        return
    for name, function in (
        ("mul", lambda a, b: a * b),
        ("div", lambda a, b: a / b),
        ("max", lambda a, b: max(a, b)),
        ("add", lambda a, b: a + b),
    ):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)


def _missing_base(error: FileNotFoundError, path: Path, root: Path | None) -> MMPOInputError:
    missing = Path(error.filename or str(error))
    if root is not None and missing.is_relative_to(root):
        where = f"NeMo-RL's checkout at {root} has no such config (NEMO_RL_PATH names another?)"
    elif missing.resolve().is_relative_to(CONFIGS_DIR):
        where = f"nemo-mmpo's configs ({CONFIGS_DIR}) have no such file"
    else:
        where = "a path relative to the file that names it, or absolute"
    return MMPOInputError(
        f"config {str(path)!r} inherits {missing}, which does not exist: {where}. In "
        "defaults:, nemo_rl/<file> names NeMo-RL's examples/configs/<file> (the checkout of "
        "NEMO_RL_PATH), base/<file> and nemo_mmpo/<file> nemo-mmpo's recipes "
        f"({CONFIGS_DIR})"
    )


@dataclass(frozen=True)
class RunStart:
    """How a run was started, read from its record (:func:`write_run_record`)."""

    record: Path
    recipe: Path
    overrides: tuple[str, ...]


def run_start(path: Path) -> RunStart | None:
    """The start of the run ``path`` belongs to, when ``path`` is a run's record or the
    ``config.yaml`` NeMo-RL saved in one of its ``step_<N>`` checkpoints; None for a recipe.

    Raises:
        MMPOInputError: a saved checkpoint config whose run left no record: it lacks what the
            run was started with (the CPU rig's ``cpu_backend`` section), so it is refused.
    """
    record = path
    if path.name == "config.yaml" and (path.parent / "training_info.json").is_file():
        record = path.parent.parent / RECORD_NAME
        if not record.is_file():
            raise MMPOInputError(
                f"{path} is the config NeMo-RL saved with checkpoint {path.parent.name}, which "
                f"does not say how the run started ({record} is missing: a run started without "
                "nemo-mmpo's entry point or before 0.1.0); pass the recipe and overrides the "
                "run was started with: --config RECIPE key=value ..."
            )
    with open(record, encoding="utf-8") as handle:
        first = handle.readline()
    if not first.startswith(RECORD_HEADER):
        return None
    try:
        started = json.loads(first.removeprefix(RECORD_HEADER))
        return RunStart(record, Path(started["recipe"]), tuple(started["overrides"]))
    except (ValueError, KeyError, TypeError):
        raise MMPOInputError(
            f"{record}'s first line is not the record nemo-mmpo writes ({RECORD_HEADER}"
            "{...}): pass the recipe the run was started with"
        ) from None


def write_run_record(loaded: LoadedConfig, folder: Path) -> Path:
    """``folder/nemo_mmpo_recipe.yaml`` (written atomically): a line saying how the run started
    (recipe, overrides, NeMo-RL checkout), then :attr:`LoadedConfig.composed`. NeMo-RL's
    ``run_grpo.py`` reads it with the same overrides, as the dry run read the same text; given
    as ``--config`` (or the ``step_<N>/config.yaml`` beside it), every command reads the run
    as it was started."""
    header = {
        "recipe": str(loaded.recipe or loaded.source),
        "overrides": list(loaded.overrides),
        "nemo_rl": str(loaded.nemo_rl_root) if loaded.nemo_rl_root else None,
    }
    text = (
        f"{RECORD_HEADER}{json.dumps(header)}\n"
        "# The recipe merged with its bases (defaults:), before the overrides above; NeMo-RL's\n"
        "# run_grpo.py reads this file, then applies them. `nemo-mmpo train --config <this file>`\n"
        "# (or a step_<N>/config.yaml beside it) and `nemo-mmpo eval watch --config ...` read the\n"
        "# run as it was started (more overrides may follow).\n"
        f"{loaded.composed}"
    )
    path = Path(folder) / RECORD_NAME
    write_text_atomic(path, text)
    return path


_COMPOSED: list[Path] = []  # this process's folder of composed recipes, made on first use


def _read_composed(module: ModuleType | None, text: str) -> Any:
    """``text`` as NeMo-RL's ``load_config`` reads it from a file (OmegaConf's, without one):
    a file named by its content, in a folder of this process removed when it exits."""
    from omegaconf import OmegaConf

    if not _COMPOSED:
        _COMPOSED.append(Path(tempfile.mkdtemp(prefix="nemo-mmpo-composed-")))
        atexit.register(shutil.rmtree, _COMPOSED[0], True)
    path = _COMPOSED[0] / f"{hashlib.sha256(text.encode()).hexdigest()}.yaml"
    if not path.is_file():
        write_text_atomic(path, text)
    return module.load_config(str(path)) if module else OmegaConf.load(path)


def load(
    path: str | Path, overrides: Sequence[str] = (), nemo_rl_root: Path | None = None
) -> LoadedConfig:
    """``path`` (relative to the current directory, or absolute; where no such file is, a
    ``nemo_mmpo/<file>`` names one of nemo-mmpo's recipes, as in ``defaults:``) with
    ``overrides``, resolved
    as NeMo-RL's ``run_grpo.py`` resolves it, its ``nemo_rl/`` bases read from ``nemo_rl_root``
    (default: :func:`~nemo_mmpo.checkout.find_nemo_rl_root`). A run's record, or a
    ``step_<N>/config.yaml`` beside one, is read as the run started: its composed config with
    its overrides, then ``overrides``.

    Raises:
        MMPOInputError: the file, a base config, an override or an interpolation is wrong;
            the message says which and how to fix it.
    """
    try:
        from omegaconf import OmegaConf
    except ImportError as error:
        raise _requirements_missing(error) from None
    path = Path(path).expanduser()
    if not path.is_file() and not path.is_absolute():
        path = packaged(path.as_posix()) or path
    path = path.resolve()
    if not path.is_file():
        raise MMPOInputError(f"config file {str(path)!r} does not exist or is not a file")
    started = run_start(path)
    if started is not None:
        overrides = (*started.overrides, *overrides)
    root = nemo_rl_root if nemo_rl_root is not None else find_nemo_rl_root()
    module, loader = nemo_rl_config_module(root)
    _register_resolvers(module)
    merge = module.merge_with_override if module else _merge
    try:
        composed = OmegaConf.to_yaml(compose(started.record if started else path, root, merge))
        config = _read_composed(module, composed)
    except FileNotFoundError as error:
        raise _missing_base(error, path, root) from None
    except MMPOInputError:
        raise
    except Exception as error:
        raise MMPOInputError(f"config {str(path)!r} failed to load: {error}") from None
    if overrides:
        try:
            if module is not None:
                config = module.parse_hydra_overrides(config, list(overrides))
            else:
                config = _apply_overrides(config, overrides)
        except ImportError as error:
            raise _requirements_missing(error) from None
        except Exception as error:
            cause = error.__cause__ or error
            raise MMPOInputError(
                f"overrides {' '.join(overrides)!r} were refused: {cause}. Use key=value for "
                "keys the config has, +key=value for new ones, ++key=value for either, ~key "
                "to delete one"
            ) from None
    try:
        resolved = OmegaConf.to_container(config, resolve=True)
    except Exception as error:
        raise MMPOInputError(f"config {str(path)!r} does not resolve: {error}") from None
    loader = loader or "OmegaConf and Hydra's override parser (no NeMo-RL checkout found)"
    if started is not None:
        loader += f"; the run as started from {started.recipe} (recorded in {started.record})"
    return LoadedConfig(
        resolved,
        path,
        tuple(overrides),
        loader,
        composed,
        root,
        started.recipe if started else None,
    )
