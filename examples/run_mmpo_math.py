#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = []
# ///
"""Train with MMPO inside NeMo-RL's GRPO: ``uv run examples/run_mmpo_math.py [--config X] [k=v]``.

Flow: load and validate the config (ours inherit NeMo-RL's through ``defaults:``), print the
run plan, make sure the MATH data files exist, ``nemo_mmpo.nemo_rl.install()``, then run
NeMo-RL's own ``examples/run_grpo.py`` (its setup, trainer, logging, checkpointing) with the
same config and overrides.

It must run in NeMo-RL's environment (its container, or ``uv run --project $NEMO_RL_PATH``).
Started anywhere else (for example by ``uv run`` from this repository, which gives the script a
bare environment), it re-executes itself there when it can find NeMo-RL (``$NEMO_RL_PATH`` or
``/opt/nemo-rl``). ``--dry-run`` needs neither NeMo-RL nor a GPU: it prints the plan and exits.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import runpy
import shutil
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS_DIR = REPO_ROOT / "examples" / "configs"
DEFAULT_CONFIG = CONFIGS_DIR / "mmpo_math_qwen3_1.7b.yaml"
REEXEC_FLAG = "NEMO_MMPO_REEXECUTED"
sys.path.insert(0, str(REPO_ROOT))


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="YAML recipe")
    parser.add_argument(
        "--dry-run", action="store_true", help="validate and print the run plan, then exit"
    )
    parser.add_argument(
        "--prepare-data",
        action="store_true",
        help="write data/math_train.jsonl and data/math_validation.jsonl, then exit",
    )
    return parser.parse_known_args(argv)


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _nemo_rl_root_without_imports() -> Path | None:
    for candidate in (os.environ.get("NEMO_RL_PATH"), "/opt/nemo-rl"):
        if candidate and (Path(candidate) / "examples" / "run_grpo.py").exists():
            return Path(candidate)
    return None


def reexecute_in_nemo_rl(argv: list[str], reason: str) -> None:
    """Replace this process by the same command inside NeMo-RL's uv project, or exit."""
    root = _nemo_rl_root_without_imports()
    if root is None or os.environ.get(REEXEC_FLAG) or shutil.which("uv") is None:
        sys.exit(
            f"run_mmpo_math.py: {reason}. Run it inside NeMo-RL's environment: in its container "
            "(NeMo-RL at /opt/nemo-rl), or set NEMO_RL_PATH=<your NeMo-RL v0.7.0 checkout> and "
            "have `uv` on PATH. For a plan without NeMo-RL use --dry-run from a virtual "
            "environment with nemo-mmpo installed (pip install -e '.[test]')."
        )
    environment = dict(os.environ, NEMO_RL_PATH=str(root))
    environment[REEXEC_FLAG] = "1"
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    command = ["uv", "run", "--project", str(root), "python", str(Path(__file__).resolve())]
    print(f"[nemo-mmpo] {reason}; re-running in NeMo-RL's environment at {root}", flush=True)
    os.execvpe("uv", [*command, *argv], environment)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, overrides = parse_args(argv)
    if not all(_importable(name) for name in ("torch", "yaml")):
        reexecute_in_nemo_rl(argv, "torch and pyyaml are not importable here")
    if not (args.dry_run or args.prepare_data) and not _importable("nemo_rl"):
        reexecute_in_nemo_rl(argv, "nemo_rl is not importable here")

    from nemo_mmpo.errors import MMPOInputError
    from nemo_mmpo.nemo_rl import run_config

    nemo_rl_root = run_config.find_nemo_rl_root()
    if nemo_rl_root is not None:
        run_config.link_nemo_rl_configs(CONFIGS_DIR, nemo_rl_root)
    try:
        loaded = run_config.load_run_config(args.config, overrides)
        warnings = run_config.validate_run_config(loaded.config)
    except MMPOInputError as error:
        print(f"run_mmpo_math.py: invalid configuration: {error}", file=sys.stderr)
        return 2
    print(run_config.run_plan(loaded))
    for warning in warnings:
        print(f"WARNING: {warning}")
    if args.dry_run:
        return 0

    if (loaded.config.get("cpu_backend") or {}).get("enabled"):
        # the tiny CPU run: our CPU backends in NeMo-RL's grpo_train, no MATH data, no GPU
        from nemo_mmpo.nemo_rl import tiny_cpu

        os.chdir(REPO_ROOT)
        try:
            tiny_cpu.run(loaded.config)
        except MMPOInputError as error:
            print(f"run_mmpo_math.py: {error}", file=sys.stderr)
            return 2
        return 0

    data_paths = [
        REPO_ROOT / loaded.config["data"][split]["data_path"] for split in ("train", "validation")
    ]
    if args.prepare_data or not all(path.exists() for path in data_paths):
        from nemo_mmpo.data import prepare_training_data

        written = prepare_training_data(data_paths[0].parent)
        print(f"[nemo-mmpo] wrote {written['train']} and {written['validation']}")
        if args.prepare_data:
            return 0

    from nemo_mmpo.nemo_rl import install

    # NeMo-RL's run_grpo.py builds the loss inside setup() and the estimator inside the
    # trainer, so both are hooked; install() also puts nemo_mmpo on the Ray workers' path.
    try:
        hooked = install()
    except RuntimeError as error:
        print(f"run_mmpo_math.py: {error}", file=sys.stderr)
        return 1
    print(f"[nemo-mmpo] hooked into NeMo-RL: {', '.join(hooked)}")
    os.chdir(REPO_ROOT)  # relative paths in the recipes (data, prompts, logs) start here
    run_grpo = nemo_rl_root / "examples" / "run_grpo.py"
    sys.argv = [str(run_grpo), "--config", str(args.config.resolve()), *overrides]
    runpy.run_path(str(run_grpo), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
