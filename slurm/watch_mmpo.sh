#!/usr/bin/env bash
# Evaluate a training run's checkpoints with the paper's protocol as they appear: one GPU job
# beside the training job, running `nemo-mmpo eval watch --follow` (vLLM) in NeMo-RL's
# container. Safe to submit before, during or after training, and to requeue: it skips what it
# evaluated and resumes a step it was interrupted in.
# Usage:  CONFIG=<the training run's recipe> bash slurm/watch_mmpo.sh [overrides]
# (default: examples/configs/mmpo_math_qwen3_1.7b.yaml; the training run's overrides, as
# submitted; or CONFIG=<checkpoint_dir>/nemo_mmpo_recipe.yaml, the run's record, which carries
# them). Submit from the training run's WORK_DIR (its relative paths start there too); the
# job's output goes to LOG_DIR (created).
set -euo pipefail

# ---------------------------------------------------------------- edit these -----------
ACCOUNT="${ACCOUNT:-YOUR_ACCOUNT}"
PARTITION="${PARTITION:-YOUR_PARTITION}"
CONTAINER="${CONTAINER:-nvcr.io/nvidia/nemo-rl:v0.7.0}"
NEMO_RL_DIR="${NEMO_RL_DIR:-/opt/nemo-rl}"           # NeMo-RL checkout inside the container
MMPO_DIR="${MMPO_DIR:-$(cd "$(dirname "$0")/.." && pwd)}"  # this repository (shared filesystem)
CONFIG="${CONFIG:-examples/configs/mmpo_math_qwen3_1.7b.yaml}"  # the training run's recipe
WORK_DIR="${WORK_DIR:-$PWD}"                        # the run's relative paths start here
LOG_DIR="${LOG_DIR:-$WORK_DIR/logs}"                # the job's output (created)
TIME="${TIME:-24:00:00}"
JOB_NAME="${JOB_NAME:-watch-$(basename "$CONFIG" .yaml)}"
SBATCH="${SBATCH:-sbatch}"
EXTRA_MOUNTS="${EXTRA_MOUNTS:-}"
BACKEND="${BACKEND:-vllm}"                          # vllm (GPU) or hf
# ----------------------------------------------------------------------------------------

# A recipe of your own, or the run's record (results/<run>/nemo_mmpo_recipe.yaml), as in
# submit_mmpo.sh: absolute, its folder mounted at the same path in the job.
# shellcheck source=slurm/job_paths.sh
source "$MMPO_DIR/slurm/job_paths.sh"
echo "recipe: $CONFIG (relative paths from $WORK_DIR)" >&2
mkdir -p "$LOG_DIR"  # Slurm does not create the --output folder
WATCH="cd $(printf '%q' "$WORK_DIR") && NEMO_RL_PATH=$NEMO_RL_DIR PYTHONPATH=$(printf '%q' "$MMPO_DIR") uv run --project $NEMO_RL_DIR python -m nemo_mmpo.eval watch --config $(printf '%q' "$CONFIG") --backend $BACKEND --follow $(printf '%q ' "$@")"
"$SBATCH" \
    --nodes=1 \
    --account="$ACCOUNT" \
    --partition="$PARTITION" \
    --job-name="$JOB_NAME" \
    --time="$TIME" \
    --gres=gpu:1 \
    --output="$LOG_DIR/%x-%j.out" \
    --wrap="srun --container-image=$CONTAINER --container-mounts=$MOUNTS --container-workdir=$WORK_DIR bash -c $(printf '%q' "$WATCH")"
