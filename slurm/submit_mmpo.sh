#!/usr/bin/env bash
# Submit an MMPO run through NeMo-RL's own Ray-on-Slurm launcher (ray.sub); every setting is
# a variable below (or in the environment). slurm/mmpo_1node.sh and slurm/mmpo_multinode.sh
# call this with their defaults.
# Usage:  NUM_NODES=2 CONFIG=examples/configs/X.yaml bash slurm/submit_mmpo.sh [overrides]
# The recipe's cluster.num_nodes / cluster.gpus_per_node are set from NUM_NODES / GPUS_PER_NODE.
set -euo pipefail

# ---------------------------------------------------------------- edit these -----------
ACCOUNT="${ACCOUNT:-YOUR_ACCOUNT}"                    # Slurm account
PARTITION="${PARTITION:-YOUR_PARTITION}"              # Slurm partition
CONTAINER="${CONTAINER:-nvcr.io/nvidia/nemo-rl:v0.7.0}"  # NeMo-RL container image (tested release)
NEMO_RL_DIR="${NEMO_RL_DIR:-/opt/nemo-rl}"            # NeMo-RL checkout inside the container
NEMO_RL_HOST_DIR="${NEMO_RL_HOST_DIR:-}"             # NeMo-RL checkout on the login node (ray.sub)
MMPO_DIR="${MMPO_DIR:-$(cd "$(dirname "$0")/.." && pwd)}"  # this repository (shared filesystem)
CONFIG="${CONFIG:-examples/configs/mmpo_math_qwen3_8b_2nodes.yaml}"  # relative to MMPO_DIR
NUM_NODES="${NUM_NODES:-2}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
TIME="${TIME:-24:00:00}"
JOB_NAME="${JOB_NAME:-mmpo-$(basename "$CONFIG" .yaml)-${NUM_NODES}n}"
SBATCH="${SBATCH:-sbatch}"                            # the submit command (tests use a stand-in)
EXTRA_MOUNTS="${EXTRA_MOUNTS:-}"                      # e.g. "/lustre/hf_cache:/root/.cache/huggingface"
PYTHON="${PYTHON:-python3}"                           # login-node Python for the dry-run check
# ----------------------------------------------------------------------------------------

RAY_SUB="${RAY_SUB:-${NEMO_RL_HOST_DIR:-}/ray.sub}"
if [[ "$RAY_SUB" == "/ray.sub" ]]; then
    echo "Set NEMO_RL_HOST_DIR to a NeMo-RL checkout on the login node (it provides ray.sub)" >&2
    exit 2
fi
MOUNTS="$MMPO_DIR:$MMPO_DIR${EXTRA_MOUNTS:+,$EXTRA_MOUNTS}"
OVERRIDES=("cluster.num_nodes=$NUM_NODES" "cluster.gpus_per_node=$GPUS_PER_NODE" "$@")

cd "$MMPO_DIR"  # ray.sub runs COMMAND from the submit directory and writes its logs here
# Validate the recipe and overrides before anything is queued (a typo fails here, not on GPUs).
if ! NEMO_RL_PATH="${NEMO_RL_HOST_DIR}" "$PYTHON" examples/run_mmpo_math.py \
        --config "$CONFIG" --dry-run "${OVERRIDES[@]}" >&2; then
    echo "Not submitted: the configuration above is invalid (fix it, then submit again)" >&2
    exit 2
fi
# COMMAND is run by a shell inside the container: quote each override (values may hold spaces).
QUOTED_OVERRIDES="$(printf '%q ' "${OVERRIDES[@]}")"
COMMAND="cd $(printf '%q' "$MMPO_DIR") && NEMO_RL_PATH=$NEMO_RL_DIR uv run --project $NEMO_RL_DIR python examples/run_mmpo_math.py --config $(printf '%q' "$CONFIG") ${QUOTED_OVERRIDES% }" \
CONTAINER="$CONTAINER" \
MOUNTS="$MOUNTS" \
GPUS_PER_NODE="$GPUS_PER_NODE" \
"$SBATCH" \
    --nodes="$NUM_NODES" \
    --account="$ACCOUNT" \
    --partition="$PARTITION" \
    --job-name="$JOB_NAME" \
    --time="$TIME" \
    --gres="gpu:$GPUS_PER_NODE" \
    "$RAY_SUB"
