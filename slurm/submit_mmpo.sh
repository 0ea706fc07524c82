#!/usr/bin/env bash
# Submit an MMPO run through NeMo-RL's own Ray-on-Slurm launcher (ray.sub); every setting is
# a variable below (or in the environment). slurm/mmpo_1node.sh and slurm/mmpo_multinode.sh
# call this with their defaults.
# Usage:  NUM_NODES=2 CONFIG=<your recipe> bash /path/to/nemo-mmpo/slurm/submit_mmpo.sh [overrides]
#         cd ~/exp && CONFIG=my_task.yaml bash ~/nemo-mmpo/slurm/mmpo_1node.sh  # your folder
# Runs the recipe CONFIG names (default: nemo_mmpo/mmpo_math_qwen3_8b_2nodes.yaml): your file
# (absolute, or relative to the folder you submit from; it wins over a clone file of the same
# name), or one of nemo-mmpo's as nemo_mmpo/<file> (or examples/configs/<file>); see
# slurm/job_paths.sh. Its relative paths (checkpoints, logs, data) start in WORK_DIR, the
# directory you submit from by default, mounted at the same path in the job, as NeMo-RL reads
# them from its working directory. The login node's PYTHON checks the recipe first: it needs
# torch (a CPU build is enough) and nemo-mmpo's launch extra: pip install '<this clone>[launch]'.
# The recipe's cluster.num_nodes / cluster.gpus_per_node are set from NUM_NODES / GPUS_PER_NODE.
# On a partition whose nodes declare GPU GRES (gpu:8), the job claims whole nodes, as ray.sub
# insists, and the recipe uses GPUS_PER_NODE of each; the count is read with sinfo before anything
# is queued, and a partition ray.sub cannot run on is refused in one line (slurm/partition_gpus.sh).
# The batch script is slurm/ray_job.sh: it runs ray.sub unchanged and watches the job's nodes; a
# lost node ends the job with a line naming it and the checkpoint to resume from. The job is
# submitted --no-requeue: submitting the same command again resumes from that checkpoint.
# ray.sub's own settings (BASE_LOG_DIR, PORT, CPUS_PER_WORKER, OMP_NUM_THREADS, ...) pass through
# the environment: sbatch hands the job this script's environment.
#
# Without a container (NeMo-RL's Python environment on a shared filesystem instead of its image):
# PYTHON_LAUNCHER is that environment's python; JOB_ENV puts its `ray` on the job's PATH (ray.sub
# calls it), NeMo-RL on PYTHONPATH and NEMO_RL_PY_EXECUTABLES_SYSTEM=1 (Ray's workers use that
# python instead of uv-built environments): ray.sub, Ray and its workers inherit the job's
# environment. srun must still accept pyxis's --container-* options, which ray.sub always passes.
#   NEMO_RL_DIR=/shared/RL NEMO_RL_HOST_DIR=/shared/RL PYTHON=/shared/venv/bin/python \
#   PYTHON_LAUNCHER=/shared/venv/bin/python \
#   JOB_ENV="PATH=/shared/venv/bin:$PATH PYTHONPATH=/shared/RL NEMO_RL_PY_EXECUTABLES_SYSTEM=1" \
#   bash slurm/submit_mmpo.sh
# (scripts/test_slurm.sh submits the tiny CPU recipe this way to a real one-machine Slurm.)
set -euo pipefail

# ---------------------------------------------------------------- edit these -----------
ACCOUNT="${ACCOUNT:-YOUR_ACCOUNT}"                    # Slurm account
PARTITION="${PARTITION:-YOUR_PARTITION}"              # Slurm partition
CONTAINER="${CONTAINER:-nvcr.io/nvidia/nemo-rl:v0.7.0}"  # NeMo-RL container image (tested release)
NEMO_RL_DIR="${NEMO_RL_DIR:-/opt/nemo-rl}"            # NeMo-RL checkout inside the container
NEMO_RL_HOST_DIR="${NEMO_RL_HOST_DIR:-}"             # NeMo-RL checkout on the login node (ray.sub)
MMPO_DIR="${MMPO_DIR:-$(cd "$(dirname "$0")/.." && pwd)}"  # this repository (shared filesystem)
CONFIG="${CONFIG:-nemo_mmpo/mmpo_math_qwen3_8b_2nodes.yaml}"  # your recipe, or nemo_mmpo/<file>
WORK_DIR="${WORK_DIR:-$PWD}"                          # the run's relative paths start here
NUM_NODES="${NUM_NODES:-2}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"                  # the GPUs the recipe uses on each node
TIME="${TIME:-24:00:00}"
JOB_NAME="${JOB_NAME:-mmpo-$(basename "$CONFIG" .yaml)-${NUM_NODES}n}"
SBATCH="${SBATCH:-sbatch}"                            # the submit command (tests use a stand-in)
EXTRA_MOUNTS="${EXTRA_MOUNTS:-}"                      # e.g. "/lustre/hf_cache:/root/.cache/huggingface"
PYTHON="${PYTHON:-python3}"                           # login-node Python for the dry-run check
PYTHON_LAUNCHER="${PYTHON_LAUNCHER:-uv run --project $NEMO_RL_DIR python}"  # starts the job's Python
JOB_ENV="${JOB_ENV:-}"                                # NAME=VALUE ... for the job (no spaces in values)
# ----------------------------------------------------------------------------------------

RAY_SUB="${RAY_SUB:-${NEMO_RL_HOST_DIR:-}/ray.sub}"
if [[ "$RAY_SUB" == "/ray.sub" ]]; then
    echo "Set NEMO_RL_HOST_DIR to a NeMo-RL checkout on the login node (it provides ray.sub)" >&2
    exit 2
fi
if [[ ! -f "$RAY_SUB" ]]; then
    echo "No ray.sub at $RAY_SUB: set NEMO_RL_HOST_DIR to a NeMo-RL checkout on the login node" >&2
    exit 2
fi
# shellcheck source=slurm/job_paths.sh
source "$MMPO_DIR/slurm/job_paths.sh"  # CONFIG made absolute; MOUNTS: this clone, WORK_DIR, CONFIG's folder
echo "recipe: $CONFIG (relative paths from $WORK_DIR)" >&2
# shellcheck source=slurm/partition_gpus.sh
source "$MMPO_DIR/slurm/partition_gpus.sh"  # RAY_SUB_GPUS and GRES_OPTIONS from the partition's GRES
OVERRIDES=("cluster.num_nodes=$NUM_NODES" "cluster.gpus_per_node=$GPUS_PER_NODE" "$@")

cd "$WORK_DIR"  # ray.sub runs COMMAND from the submit directory and writes its logs here
# Check the recipe and overrides before anything is queued (a typo fails here, not on GPUs),
# with NeMo-RL's own config loader read from the login node's checkout.
set +e
plan="$(NEMO_RL_PATH="${NEMO_RL_HOST_DIR}" "$PYTHON" "$MMPO_DIR/examples/run_mmpo_math.py" \
    --config "$CONFIG" --dry-run "${OVERRIDES[@]}")"
status=$?
set -e
[[ -n "$plan" ]] && echo "$plan" >&2
if [[ $status -eq 3 ]]; then
    echo "Not submitted: $PYTHON cannot run the check (see above); set PYTHON to a Python with nemo-mmpo's launch extra" >&2
    exit 3
elif [[ $status -ne 0 ]]; then
    echo "Not submitted: the configuration above is invalid (fix it, then submit again)" >&2
    exit 2
fi
# The job's watch names the checkpoint to resume from when a node is lost (the plan's line
# "... checkpoints: DIR[ (note)]; logs: ...", "checkpoints: none (...)" when it saves none; a
# relative DIR is under WORK_DIR, where the job runs).
CHECKPOINT_DIR="$(sed -n 's/.*; checkpoints: \(.*\); logs: .*/\1/p' <<< "$plan" | tail -n 1)"
CHECKPOINT_DIR="${CHECKPOINT_DIR%% (*}"
[[ "$CHECKPOINT_DIR" == none ]] && CHECKPOINT_DIR=""
[[ -n "$CHECKPOINT_DIR" && "$CHECKPOINT_DIR" != /* ]] && CHECKPOINT_DIR="$WORK_DIR/$CHECKPOINT_DIR"
# ray.sub's own #SBATCH lines (--exclusive, --dependency=singleton, ...) as options: the batch
# script is slurm/ray_job.sh, which runs ray.sub; the options after them win.
mapfile -t RAY_SUB_DIRECTIVES < <(awk '/^#SBATCH/ {print $2; next} /^#|^$/ {next} {exit}' "$RAY_SUB")
# COMMAND is run by a shell inside the container: quote each override (values may hold spaces).
QUOTED_OVERRIDES="$(printf '%q ' "${OVERRIDES[@]}")"
# env adds JOB_ENV's assignments, then ray.sub's inputs, to the environment sbatch hands the job.
read -r -a job_environment <<< "$JOB_ENV"
env "${job_environment[@]}" \
COMMAND="cd $(printf '%q' "$WORK_DIR") && NEMO_RL_PATH=$NEMO_RL_DIR $PYTHON_LAUNCHER $(printf '%q' "$MMPO_DIR/examples/run_mmpo_math.py") --config $(printf '%q' "$CONFIG") ${QUOTED_OVERRIDES% }" \
CONTAINER="$CONTAINER" \
MOUNTS="$MOUNTS" \
GPUS_PER_NODE="$RAY_SUB_GPUS" \
MMPO_RAY_SUB="$(cd "$(dirname "$RAY_SUB")" && pwd)/$(basename "$RAY_SUB")" \
MMPO_CHECKPOINT_DIR="$CHECKPOINT_DIR" \
"$SBATCH" \
    "${RAY_SUB_DIRECTIVES[@]}" \
    --no-requeue \
    --nodes="$NUM_NODES" \
    --account="$ACCOUNT" \
    --partition="$PARTITION" \
    --job-name="$JOB_NAME" \
    --time="$TIME" \
    "${GRES_OPTIONS[@]}" \
    "$MMPO_DIR/slurm/ray_job.sh"
