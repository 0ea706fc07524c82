# shellcheck shell=bash disable=SC2034  # RAY_SUB_GPUS, GRES_OPTIONS: read by submit_mmpo.sh
# Sourced by slurm/submit_mmpo.sh: the GPUs the job claims on each node, read on the login node
# from Slurm, before anything is queued. NeMo-RL's ray.sub (maybe_gres_arg, v0.7.0 and main)
# reads the partition's GRES with `sinfo -p <partition> -o %G`; where its nodes declare GPUs it
# claims whole nodes, `--gres=gpu:<GPUS_PER_NODE>` on every srun, and exits inside the job (after
# the wait in the queue) unless GPUS_PER_NODE is the nodes' count. So ray.sub gets the nodes'
# count, and the recipe keeps the GPUs it asks for (cluster.gpus_per_node, set from
# GPUS_PER_NODE): `partition batch: nodes have gpu:8; claiming 8 a node for ray.sub, the recipe
# uses 2`. Where the nodes declare no GPU GRES, ray.sub claims none (no --gres) and Ray sees the
# node's GPUs (--exclusive): the job is submitted without --gres (sbatch would refuse one there:
# "Requested node configuration is not available"). Refused in one line, exit 2: a partition
# Slurm lists no node in, nodes with different GPU counts (ray.sub reads one count), a recipe
# asking more GPUs than a node has.
# In: PARTITION, GPUS_PER_NODE (the recipe's GPUs on each node). Out: RAY_SUB_GPUS (ray.sub's
# GPUS_PER_NODE), GRES_OPTIONS (sbatch's --gres, an array: empty where the nodes declare none).
if ! [[ "$GPUS_PER_NODE" =~ ^[1-9][0-9]*$ ]]; then
    echo "GPUS_PER_NODE=$GPUS_PER_NODE: not a whole number of GPUs; set it to the GPUs the recipe uses on each node, e.g. GPUS_PER_NODE=2" >&2
    exit 2
fi
if ! command -v sinfo >/dev/null 2>&1; then
    echo "Not submitted: no sinfo on this machine; submit from the cluster's login node (partition $PARTITION's GPUs are read with sinfo, as ray.sub reads them)" >&2
    exit 2
fi
if ! partition_gres="$(sinfo -p "$PARTITION" -h -o '%G' 2>&1)"; then
    echo "Not submitted: sinfo -p $PARTITION failed: $(head -n 1 <<< "$partition_gres")" >&2
    exit 2
fi
if [[ -z "$partition_gres" ]]; then
    echo "Not submitted: PARTITION=$PARTITION: Slurm lists no node in it; set PARTITION to one of: $(sinfo -h -o '%R' 2>/dev/null | sort -u | paste -sd ' ')" >&2
    exit 2
fi
# ray.sub's reading: the lines naming gpu:, the socket spec "(S:0-3)" cut, the last number
partition_gpu_gres="$( (grep 'gpu:' <<< "$partition_gres" || true) | sort -u)"
RAY_SUB_GPUS="$GPUS_PER_NODE"
GRES_OPTIONS=()
if [[ -z "$partition_gpu_gres" ]]; then
    echo "partition $PARTITION: its nodes declare no GPU GRES; submitting without --gres, as ray.sub runs there (Ray sees each whole node); the recipe uses $GPUS_PER_NODE a node" >&2
else
    partition_gpu_counts="$(cut -d'(' -f1 <<< "$partition_gpu_gres" | awk -F: '{print $NF}' | sort -u)"
    partition_gres_said="$(awk 'NR > 1 {printf ", "} {printf "%s", $0}' <<< "$partition_gpu_gres")"
    if [[ "$partition_gpu_counts" == *$'\n'* ]]; then
        echo "Not submitted: partition $PARTITION's nodes have different GPU counts ($partition_gres_said) and ray.sub claims one count on every node; pick a partition whose nodes all have the same (sinfo -p $PARTITION -o '%N %G' lists them)" >&2
        exit 2
    elif ! [[ "$partition_gpu_counts" =~ ^[1-9][0-9]*$ ]]; then
        echo "Not submitted: partition $PARTITION's nodes declare GPU GRES $partition_gres_said, in which ray.sub reads no GPU count ('$partition_gpu_counts'); pick a partition whose nodes declare gpu:<count>" >&2
        exit 2
    elif ((GPUS_PER_NODE > partition_gpu_counts)); then
        echo "Not submitted: GPUS_PER_NODE=$GPUS_PER_NODE but partition $PARTITION's nodes have $partition_gres_said; set GPUS_PER_NODE to $partition_gpu_counts or fewer (and the recipe's layout to fit), or pick a partition with more GPUs a node" >&2
        exit 2
    fi
    RAY_SUB_GPUS="$partition_gpu_counts"
    GRES_OPTIONS=("--gres=gpu:$RAY_SUB_GPUS")
    echo "partition $PARTITION: nodes have $partition_gres_said; claiming $RAY_SUB_GPUS a node for ray.sub, the recipe uses $GPUS_PER_NODE" >&2
fi
