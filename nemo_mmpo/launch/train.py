"""``nemo-mmpo train`` (and ``examples/run_mmpo_math.py``): check, plan, then train.

1. Load the recipe and overrides exactly as NeMo-RL will (:mod:`nemo_mmpo.recipes`).
   ``--config`` and the recipe's relative paths (data, checkpoints, logs) are resolved
   against the directory the command runs in, as NeMo-RL resolves them.
2. Run every rule (:mod:`nemo_mmpo.launch.rules`): all errors are printed, then exit status 2.
3. Print the plan (:mod:`nemo_mmpo.launch.plan`), the warnings, and with ``--print-config`` the
   resolved config as YAML. ``--dry-run`` stops here; it needs no GPU and no NeMo-RL.
4. Train: the tiny CPU run for ``cpu_backend.enabled`` recipes (:mod:`nemo_mmpo.cpu.rig.driver`);
   otherwise write the MATH task's files if the recipe names them and one is missing (any
   other data section is NeMo-RL's: :func:`nemo_mmpo.data.math_task_files`), ``install()``
   our estimator and loss, and
   run NeMo-RL's own ``examples/run_grpo.py`` with the same overrides on the composed recipe
   the dry run read, written into the run's ``checkpointing.checkpoint_dir``
   (``nemo_mmpo_recipe.yaml``, which also records how the run started; both paths write it).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import runpy
import sys
from pathlib import Path

from nemo_mmpo import recipes
from nemo_mmpo.checkout import CONFIGS_DIR, find_nemo_rl_root
from nemo_mmpo.cpu.rig import driver
from nemo_mmpo.data import MATH_TRAIN, math_task_files, prepare_math_task
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.launch import environment, plan, rules, trainers
from nemo_mmpo.nemo_rl import install
from nemo_mmpo.nemo_rl.hooks import worker_pythonpath
from nemo_mmpo.plugins import load_plugins, recipe_plugins
from nemo_mmpo.settings import mark_reported

DEFAULT_CONFIG = CONFIGS_DIR / "mmpo_math_qwen3_1.7b.yaml"


def parser(prog: str) -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(
        prog=prog,
        description="Train with MMPO in NeMo-RL's GRPO (NeMo-RL's Hydra overrides follow).",
    )
    result.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        help="YAML recipe (relative to the current directory, or absolute)",
    )
    result.add_argument(
        "--dry-run", action="store_true", help="check and print the run plan, then exit"
    )
    result.add_argument(
        "--print-config",
        action="store_true",
        help="also print the resolved config NeMo-RL would train with (YAML); implies --dry-run",
    )
    result.add_argument(
        "--prepare-data",
        action="store_true",
        help="write the MATH task's files where the recipe names them (data/ for the paper's "
        "recipes), then exit (needs the eval extra)",
    )
    return result


def check_and_plan(config_path: Path, overrides: list[str], print_config: bool) -> object:
    """Load, check and print the plan; returns the loaded config, raises on any error."""
    try:
        loaded = recipes.load(config_path, overrides)
    except MMPOInputError as error:  # Hydra's and OmegaConf's messages span lines: one line
        raise MMPOInputError(" ".join(str(error).split())) from None
    # the recipe's own estimators and losses, registered before anything reads the registries
    load_plugins(
        recipe_plugins(loaded.config), Path(loaded.recipe or loaded.source).resolve().parent
    )
    findings = rules.check(loaded.config)
    if len(findings.errors) == 1:
        raise MMPOInputError(findings.errors[0])
    if findings.errors:
        raise MMPOInputError("\n  ".join(["invalid configuration:", *findings.errors]))
    loaded = dataclasses.replace(loaded, config=findings.config)  # as NeMo-RL reads it
    print(plan.describe(loaded))
    for warning in findings.warnings:
        print(f"WARNING: {warning}")
    # the estimator and losses report unread settings at construction: not again in this run
    mark_reported(findings.warnings)
    if print_config:
        print("--- resolved config (what NeMo-RL trains with) ---")
        print(loaded.to_yaml(), end="")
    return loaded


def _prepare_math(loaded, prepare_data: bool) -> bool:
    """The MATH task's files (:func:`nemo_mmpo.data.math_task_files`) for a recipe that names
    them, written where it names them when one is missing (or with ``--prepare-data``); any
    other data section is NeMo-RL's and left alone. Returns whether to stop (``--prepare-data``)."""
    files = math_task_files(loaded.config)
    if files is None:
        if prepare_data:
            raise MMPOInputError(
                "--prepare-data writes the MATH task's files, and this recipe's data section "
                f"does not name them (data.train.data_path is not <folder>/{MATH_TRAIN}): "
                "NeMo-RL reads its data as the recipe says; there is nothing to prepare"
            )
        return False
    written = prepare_math_task(files, everything=prepare_data)
    if written:
        print(f"[nemo-mmpo] wrote the MATH task's files: {', '.join(map(str, written))}")
    return prepare_data


def _train_with_nemo_rl(loaded) -> int:
    # NeMo-RL's run_grpo.py builds the loss inside setup() and the estimator inside the
    # trainer, so both are hooked; install() also puts nemo_mmpo on the Ray workers' path.
    hooked = install()
    print(f"[nemo-mmpo] hooked into NeMo-RL: {', '.join(hooked)}")
    nemo_rl_root = loaded.nemo_rl_root or find_nemo_rl_root()
    if nemo_rl_root is None:
        raise MMPOInputError("NeMo-RL's checkout was not found: set NEMO_RL_PATH")
    # NeMo-RL's loader reads the composed text the dry run read, from the run's folder; the
    # recipe's relative paths (data, logs, checkpoints) start in this working directory, as
    # NeMo-RL's own run_grpo.py reads them
    record = recipes.write_run_record(loaded, run_folder(loaded.config))
    print(f"[nemo-mmpo] the run's recipe, as NeMo-RL reads it: {record}")
    run_grpo = trainers.driver_script(loaded.config, nemo_rl_root)  # or the single controller
    sys.argv = [str(run_grpo), "--config", str(record), *loaded.overrides]
    runpy.run_path(str(run_grpo), run_name="__main__")
    return 0


def run_folder(config: dict) -> Path:
    """Where a run keeps its record (:func:`nemo_mmpo.recipes.write_run_record`): its
    ``checkpointing.checkpoint_dir``, beside NeMo-RL's ``step_<N>`` (relative: to the working
    directory, as NeMo-RL reads it)."""
    return Path(config["checkpointing"]["checkpoint_dir"])


def _move_into_nemo_rl(argv: list[str], prog: str) -> None:
    """Training without ``nemo_rl`` importable here: re-run this command inside NeMo-RL's uv
    project, as ``uv run examples/run_mmpo_math.py`` does (or exit saying what to run)."""
    if importlib.util.find_spec("nemo_rl") is not None:
        return
    environment.reexecute_in_nemo_rl(
        None, argv, "nemo_rl is not importable here", worker_pythonpath(), prog
    )


def main(argv: list[str] | None = None, prog: str = "nemo-mmpo train") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, overrides = parser(prog).parse_known_args(argv)
    unknown = [item for item in overrides if item.startswith("--")]
    if unknown:
        raise MMPOInputError(f"unknown option {unknown[0]} (overrides are key=value)")
    if not (args.dry_run or args.print_config or args.prepare_data):
        _move_into_nemo_rl(argv, prog)
    loaded = check_and_plan(args.config.expanduser(), overrides, args.print_config)
    if args.dry_run or args.print_config:
        return 0
    if (loaded.config.get("cpu_backend") or {}).get("enabled"):
        # the recipe's relative paths (results/, logs/) start in the working directory
        recipes.write_run_record(loaded, run_folder(loaded.config))
        driver.run(loaded.config)
        return 0
    if _prepare_math(loaded, args.prepare_data):
        return 0
    return _train_with_nemo_rl(loaded)
