#!/usr/bin/env bash
# One node, the recipe on 2 of its GPUs (GPUS_PER_NODE; on a partition of gpu:8 nodes the job
# claims all 8, as NeMo-RL's ray.sub insists: slurm/partition_gpus.sh): runs
# nemo_mmpo/mmpo_math_qwen3_1.7b.yaml (the paper's recipe, Qwen3-1.7B-Base), or your recipe with
# CONFIG=<your recipe>. Edit the variables in submit_mmpo.sh or pass them in the environment:
#   ACCOUNT=a PARTITION=p NEMO_RL_HOST_DIR=~/RL bash slurm/mmpo_1node.sh grpo.adv_estimator.truncation_order=3
#   ACCOUNT=a PARTITION=p NEMO_RL_HOST_DIR=~/RL CONFIG=my_recipe.yaml bash ~/nemo-mmpo/slurm/mmpo_1node.sh
NUM_NODES=1 \
GPUS_PER_NODE="${GPUS_PER_NODE:-2}" \
CONFIG="${CONFIG:-nemo_mmpo/mmpo_math_qwen3_1.7b.yaml}" \
exec bash "$(dirname "$0")/submit_mmpo.sh" "$@"
