#!/usr/bin/env bash
# The tiny CPU run in one command: MMPO in NeMo-RL's own GRPO loop on this machine (no GPU).
#   bash scripts/tiny_run.sh                                   # the MMPO recipe, 300 steps
#   bash scripts/tiny_run.sh --config examples/configs/grpo_tiny_cpu.yaml grpo.max_num_steps=50
# It builds what it needs (scripts/with_nemo_rl.sh: Python 3.13 and NeMo-RL's pure-Python
# dependencies in .venv-nemo-rl, reused when `bash scripts/test.sh` built it), then runs
# examples/run_mmpo_math.py with NeMo-RL from NEMO_RL_PATH, else from the v0.7.0 snapshot in
# ../shared/nemo-rl. One line per step on the terminal; NeMo-RL's own output in
# <logger.log_dir>/nemo_rl.log.
set -euo pipefail
cd "$(dirname "$0")/.."
config=()
[[ " $* " == *" --config "* ]] || config=(--config examples/configs/mmpo_tiny_cpu.yaml)
exec bash scripts/with_nemo_rl.sh python examples/run_mmpo_math.py "${config[@]}" "$@"
