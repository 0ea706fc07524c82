"""``nemo-mmpo train`` (and ``examples/run_mmpo_math.py``): check, plan, then train.

1. Load the recipe and overrides exactly as NeMo-RL will (:mod:`nemo_mmpo.recipes`).
   ``--config`` is resolved against the directory the command runs in.
2. Run every rule (:mod:`nemo_mmpo.launch.rules`): all errors are printed, then exit status 2.
3. Print the plan (:mod:`nemo_mmpo.launch.plan`), the warnings, and with ``--print-config`` the
   resolved config as YAML. ``--dry-run`` stops here; it needs no GPU and no NeMo-RL.
4. Train: the tiny CPU run for ``cpu_backend.enabled`` recipes (:mod:`nemo_mmpo.cpu.rig.driver`);
   otherwise write the MATH data files if missing, ``install()`` our estimator and loss, and
   run NeMo-RL's own ``examples/run_grpo.py`` with the same overrides on the composed recipe
   the dry run read, written into the run's ``checkpointing.checkpoint_dir``
   (``nemo_mmpo_recipe.yaml``, which also records how the run started; both paths write it).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import runpy
import sys
from pathlib import Path

from nemo_mmpo import recipes
from nemo_mmpo.checkout import CONFIGS_DIR, REPO_ROOT, find_nemo_rl_root
from nemo_mmpo.cpu.rig import driver
from nemo_mmpo.data import prepare_training_data
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.launch import plan, rules, trainers
from nemo_mmpo.nemo_rl import install
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
        help="write data/math_train.jsonl and data/math_validation.jsonl, then exit",
    )
    return result


def check_and_plan(config_path: Path, overrides: list[str], print_config: bool) -> object:
    """Load, check and print the plan; returns the loaded config, raises on any error."""
    try:
        loaded = recipes.load(config_path, overrides)
    except MMPOInputError as error:  # Hydra's and OmegaConf's messages span lines: one line
        raise MMPOInputError(" ".join(str(error).split())) from None
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


def _train_with_nemo_rl(loaded, overrides: list[str], prepare_data: bool) -> int:
    data_paths = [
        REPO_ROOT / loaded.config["data"][split]["data_path"] for split in ("train", "validation")
    ]
    evaluation = loaded.config.get("evaluation") or {}
    if evaluation.get("enabled"):  # the per-benchmark files --prepare-data writes beside them
        data_paths += [
            REPO_ROOT / path
            for path in (evaluation.get("benchmarks") or {}).values()
            if path and Path(path).parent == Path(data_paths[0].parent.name) / "validation"
        ]
    if prepare_data or not all(path.exists() for path in data_paths):
        written = prepare_training_data(data_paths[0].parent)
        print(f"[nemo-mmpo] wrote {written['train']} and {written['validation']}")
        if prepare_data:
            return 0
    # NeMo-RL's run_grpo.py builds the loss inside setup() and the estimator inside the
    # trainer, so both are hooked; install() also puts nemo_mmpo on the Ray workers' path.
    hooked = install()
    print(f"[nemo-mmpo] hooked into NeMo-RL: {', '.join(hooked)}")
    nemo_rl_root = loaded.nemo_rl_root or find_nemo_rl_root()
    if nemo_rl_root is None:
        raise MMPOInputError("NeMo-RL's checkout was not found: set NEMO_RL_PATH")
    os.chdir(REPO_ROOT)  # relative paths in the recipes (data, prompts, logs) start here
    # NeMo-RL's loader reads the composed text the dry run read, from the run's folder
    record = recipes.write_run_record(loaded, run_folder(loaded.config))
    print(f"[nemo-mmpo] the run's recipe, as NeMo-RL reads it: {record}")
    run_grpo = trainers.driver_script(loaded.config, nemo_rl_root)  # or the single controller
    sys.argv = [str(run_grpo), "--config", str(record), *loaded.overrides]
    runpy.run_path(str(run_grpo), run_name="__main__")
    return 0


def run_folder(config: dict) -> Path:
    """Where a run keeps its record (:func:`nemo_mmpo.recipes.write_run_record`): its
    ``checkpointing.checkpoint_dir``, beside NeMo-RL's ``step_<N>`` (relative: to the
    repository root, where the run starts)."""
    return REPO_ROOT / config["checkpointing"]["checkpoint_dir"]


def main(argv: list[str] | None = None, prog: str = "nemo-mmpo train") -> int:
    args, overrides = parser(prog).parse_known_args(argv)
    unknown = [item for item in overrides if item.startswith("--")]
    if unknown:
        raise MMPOInputError(f"unknown option {unknown[0]} (overrides are key=value)")
    config_path = args.config.expanduser().resolve()  # before any change of directory
    loaded = check_and_plan(config_path, overrides, args.print_config)
    if args.dry_run or args.print_config:
        return 0
    if (loaded.config.get("cpu_backend") or {}).get("enabled"):
        os.chdir(REPO_ROOT)  # the recipe's relative paths (results/, logs/) start here
        recipes.write_run_record(loaded, run_folder(loaded.config))
        driver.run(loaded.config)
        return 0
    return _train_with_nemo_rl(loaded, overrides, args.prepare_data)
