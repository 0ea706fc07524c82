#!/usr/bin/env bash
# N nodes (default 2) x 8 GPUs (GPUS_PER_NODE, the recipe's; the job claims whole nodes:
# slurm/partition_gpus.sh): runs nemo_mmpo/mmpo_math_qwen3_8b_2nodes.yaml
# (Qwen3-8B-Base, not the paper's 1.7B recipe), or your recipe with CONFIG=<your recipe>. Edit
# the variables in submit_mmpo.sh or pass them in the environment:
#   ACCOUNT=a PARTITION=p NEMO_RL_HOST_DIR=~/RL NUM_NODES=4 bash slurm/mmpo_multinode.sh
NUM_NODES="${NUM_NODES:-2}" \
GPUS_PER_NODE="${GPUS_PER_NODE:-8}" \
CONFIG="${CONFIG:-nemo_mmpo/mmpo_math_qwen3_8b_2nodes.yaml}" \
exec bash "$(dirname "$0")/submit_mmpo.sh" "$@"
