#!/usr/bin/env bash
# Evaluate a training run's checkpoints with the paper's protocol as they appear: one GPU job
# beside the training job, running `nemo-mmpo eval watch --follow` in NeMo-RL's container
# (its driver environment; vLLM samples in the vLLM worker's environment NeMo-RL prebuilt under
# NEMO_RL_VENV_DIR, a Megatron checkpoint converts in the Megatron worker's). Safe to submit before, during or after training, and to requeue: it skips what it
# evaluated and resumes a step it was interrupted in.
# Usage:  CONFIG=<the training run's recipe> bash slurm/watch_mmpo.sh [overrides]
# (default: nemo_mmpo/mmpo_math_qwen3_1.7b.yaml; the training run's overrides, as
# submitted; or CONFIG=<checkpoint_dir>/nemo_mmpo_recipe.yaml, the run's record, which carries
# them). Submit from the training run's WORK_DIR (its relative paths start there too); the
# job's output goes to LOG_DIR (created). Before anything is queued, the login node's PYTHON
# checks the recipe as the watcher reads it (`nemo-mmpo eval watch --check`, NeMo-RL's config
# loader read from NEMO_RL_HOST_DIR): it loads, evaluation and checkpointing are enabled.
set -euo pipefail

# ---------------------------------------------------------------- edit these -----------
ACCOUNT="${ACCOUNT:-YOUR_ACCOUNT}"
PARTITION="${PARTITION:-YOUR_PARTITION}"
CONTAINER="${CONTAINER:-nvcr.io/nvidia/nemo-rl:v0.7.0}"
NEMO_RL_DIR="${NEMO_RL_DIR:-/opt/nemo-rl}"           # NeMo-RL checkout inside the container
NEMO_RL_HOST_DIR="${NEMO_RL_HOST_DIR:-}"            # NeMo-RL checkout on the login node (the check)
MMPO_DIR="${MMPO_DIR:-$(cd "$(dirname "$0")/.." && pwd)}"  # this repository (shared filesystem)
CONFIG="${CONFIG:-nemo_mmpo/mmpo_math_qwen3_1.7b.yaml}"  # the training run's recipe
WORK_DIR="${WORK_DIR:-$PWD}"                        # the run's relative paths start here
LOG_DIR="${LOG_DIR:-$WORK_DIR/logs}"                # the job's output (created)
TIME="${TIME:-24:00:00}"
JOB_NAME="${JOB_NAME:-watch-$(basename "$CONFIG" .yaml)}"
SBATCH="${SBATCH:-sbatch}"
EXTRA_MOUNTS="${EXTRA_MOUNTS:-}"
BACKEND="${BACKEND:-}"                              # vllm or hf; empty: the recipe's (vllm on a GPU)
PYTHON="${PYTHON:-python3}"                         # login-node Python for the check
# ----------------------------------------------------------------------------------------

# A recipe of your own, or the run's record (results/<run>/nemo_mmpo_recipe.yaml), as in
# submit_mmpo.sh: absolute, its folder mounted at the same path in the job.
# shellcheck source=slurm/job_paths.sh
source "$MMPO_DIR/slurm/job_paths.sh"
echo "recipe: $CONFIG (relative paths from $WORK_DIR)" >&2
if [[ -z "$NEMO_RL_HOST_DIR" || ! -d "$NEMO_RL_HOST_DIR" ]]; then
    echo "Set NEMO_RL_HOST_DIR to a NeMo-RL checkout on the login node (the check reads the recipe with its config loader)" >&2
    exit 2
fi
# Check the recipe and overrides before anything is queued, as the watcher will read them.
# Importing nemo_mmpo needs torch and the launch extra: a Python without them cannot check.
missing="$("$PYTHON" -c 'import runpy, sys; print(", ".join(runpy.run_path(sys.argv[1])["missing_modules"]()))' \
    "$MMPO_DIR/nemo_mmpo/launch/environment.py")" || missing="a working Python"
if [[ -n "$missing" ]]; then
    echo "Not submitted: $PYTHON cannot run the check: it lacks $missing; set PYTHON to a Python with nemo-mmpo's launch extra (pip install '$MMPO_DIR[launch]')" >&2
    exit 3
fi
if ! (cd "$WORK_DIR" && NEMO_RL_PATH="$NEMO_RL_HOST_DIR" PYTHONPATH="$MMPO_DIR${PYTHONPATH:+:$PYTHONPATH}" \
        "$PYTHON" -m nemo_mmpo.eval watch --check --config "$CONFIG" ${BACKEND:+--backend "$BACKEND"} "$@" >&2); then
    echo "Not submitted: the watcher's check above failed (fix the recipe or overrides, then submit again)" >&2
    exit 2
fi
# One GPU, asked for as the partition declares GPUs: by GRES where its nodes have GPU GRES;
# without --gres where they have none (sbatch would refuse it there), the job's node whole
GRES_OPTIONS=()
if ! partition_gres="$(sinfo -p "$PARTITION" -h -o '%G' 2>&1)"; then
    echo "Not submitted: sinfo -p $PARTITION failed: $(head -n 1 <<< "$partition_gres")" >&2
    exit 2
elif grep -q 'gpu:' <<< "$partition_gres"; then
    GRES_OPTIONS=(--gres=gpu:1)
else
    GRES_OPTIONS=(--exclusive)
    echo "partition $PARTITION: its nodes declare no GPU GRES; the watcher takes a whole node (--exclusive), as ray.sub does there" >&2
fi
mkdir -p "$LOG_DIR"  # Slurm does not create the --output folder
QUOTED_OVERRIDES=""  # (printf '%q ' with no argument would pass one empty argument)
[[ $# -gt 0 ]] && QUOTED_OVERRIDES=" $(printf '%q ' "$@")"
WATCH="cd $(printf '%q' "$WORK_DIR") && NEMO_RL_PATH=$NEMO_RL_DIR PYTHONPATH=$(printf '%q' "$MMPO_DIR") uv run --project $NEMO_RL_DIR python -m nemo_mmpo.eval watch --config $(printf '%q' "$CONFIG")${BACKEND:+ --backend $(printf '%q' "$BACKEND")} --follow${QUOTED_OVERRIDES% }"
"$SBATCH" \
    --nodes=1 \
    --account="$ACCOUNT" \
    --partition="$PARTITION" \
    --job-name="$JOB_NAME" \
    --time="$TIME" \
    "${GRES_OPTIONS[@]}" \
    --output="$LOG_DIR/%x-%j.out" \
    --wrap="srun --container-image=$CONTAINER --container-mounts=$MOUNTS --container-workdir=$WORK_DIR bash -c $(printf '%q' "$WATCH")"
