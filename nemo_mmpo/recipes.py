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

A config that does not resolve (a missing base, a broken interpolation) is an error: nothing
is validated on an unresolved config.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from nemo_mmpo.checkout import CONFIGS_DIR, find_nemo_rl_root, link_nemo_rl_configs
from nemo_mmpo.errors import MMPOInputError

LAUNCH_EXTRA = (
    "hydra-core 1.3, omegaconf 2.3 and antlr4-python3-runtime 4.9.3 (NeMo-RL's lock): "
    "pip install 'nemo-mmpo[launch]'"
)


@dataclass(frozen=True)
class LoadedConfig:
    """A resolved config (plain dicts and lists), where it came from and how it was read."""

    config: dict[str, Any]
    source: Path
    overrides: tuple[str, ...] = ()
    loader: str = ""

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


def _merge_with_inheritance(path: Path) -> Any:
    """NeMo-RL's ``defaults:`` inheritance with OmegaConf (used only without a checkout)."""
    from omegaconf import DictConfig, OmegaConf

    config = OmegaConf.load(path)
    if not isinstance(config, DictConfig):
        raise MMPOInputError(f"config {path} must be a mapping at the top level")
    if "defaults" not in config:
        return config
    defaults = config.pop("defaults")
    merged = OmegaConf.create({})
    for default in [defaults] if isinstance(defaults, str) else list(defaults):
        parent = Path(str(default))
        parent = parent if parent.is_absolute() else path.parent / parent
        merged = _merge(merged, _merge_with_inheritance(parent))
    return _merge(merged, config)


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


def load(path: str | Path, overrides: Sequence[str] = ()) -> LoadedConfig:
    """``path`` (relative to the current directory, or absolute) with ``overrides``, resolved
    as NeMo-RL's ``run_grpo.py`` resolves it.

    Raises:
        MMPOInputError: the file, a base config, an override or an interpolation is wrong;
            the message says which and how to fix it.
    """
    try:
        from omegaconf import OmegaConf
    except ImportError as error:
        raise _requirements_missing(error) from None
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise MMPOInputError(f"config file {str(path)!r} does not exist or is not a file")
    nemo_rl_root = find_nemo_rl_root()
    if nemo_rl_root is not None and path.is_relative_to(CONFIGS_DIR.resolve()):
        link_nemo_rl_configs(nemo_rl_root)
    module, loader = nemo_rl_config_module(nemo_rl_root)
    _register_resolvers(module)
    try:
        config = module.load_config(str(path)) if module else _merge_with_inheritance(path)
    except FileNotFoundError as error:
        raise MMPOInputError(
            f"config {str(path)!r} inherits {error.filename or error}, which does not exist. "
            "Recipes inherit NeMo-RL's configs: set NEMO_RL_PATH to a NeMo-RL checkout (on a "
            "login node too) so that they resolve"
        ) from None
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
    return LoadedConfig(
        resolved,
        path,
        tuple(overrides),
        loader or "OmegaConf and Hydra's override parser (no NeMo-RL checkout found)",
    )
