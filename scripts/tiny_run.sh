#!/usr/bin/env bash
# The tiny CPU run in one command: MMPO in NeMo-RL's own GRPO loop on this machine (no GPU).
#   bash scripts/tiny_run.sh                                   # the MMPO recipe, 300 steps
#   bash scripts/tiny_run.sh --config examples/configs/grpo_tiny_cpu.yaml grpo.max_num_steps=50
# It gets and builds what it needs (scripts/with_nemo_rl.sh: NeMo-RL, Python 3.13 and
# NeMo-RL's pure-Python dependencies in .venv-nemo-rl, reused when `bash scripts/test.sh` built
# it), says where they are, then runs examples/run_mmpo_math.py on
# examples/configs/mmpo_tiny_cpu.yaml (or the --config you give). The run writes into the
# directory you run this from (results/, logs/). One line per step on the terminal; NeMo-RL's
# own output in <logger.log_dir>/nemo_rl.log.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
config=()
[[ " $* " == *" --config "* ]] || config=(--config "$root/examples/configs/mmpo_tiny_cpu.yaml")
echo "tiny_run: the run's files go under $PWD" >&2
exec bash "$root/scripts/with_nemo_rl.sh" python "$root/examples/run_mmpo_math.py" "${config[@]}" "$@"
