# Shared by slurm/submit_mmpo.sh and slurm/watch_mmpo.sh (source it): the paths a job sees.
# In: MMPO_DIR (this clone), WORK_DIR (where the run's relative paths start), CONFIG (a recipe:
# absolute, one of this clone's, e.g. examples/configs/X.yaml, or relative to where you submit),
# EXTRA_MOUNTS. Out: CONFIG absolute; MOUNTS, this clone, WORK_DIR and CONFIG's folder each
# mounted at the same path in the job (where a recipe's nemo_rl/ bases are the container's
# NeMo-RL's and its nemo_mmpo/ and base/ ones this clone's; nothing is copied into the clone).
CONFIG="${CONFIG/#\~/$HOME}"
if [[ "$CONFIG" != /* ]]; then  # one of this clone's first (examples/configs/...), else yours
    if [[ -f "$MMPO_DIR/$CONFIG" ]]; then
        CONFIG="$MMPO_DIR/$CONFIG"
    elif [[ -f "$CONFIG" ]]; then
        CONFIG="$(cd "$(dirname "$CONFIG")" && pwd)/$(basename "$CONFIG")"
    fi
fi
WORK_DIR="$(cd "$WORK_DIR" && pwd)"
MOUNTS="$MMPO_DIR:$MMPO_DIR"
for folder in "$WORK_DIR" "$(dirname "$CONFIG")"; do
    if [[ "$folder" != "$MMPO_DIR" && "$folder" != "$MMPO_DIR"/* && ",$MOUNTS," != *",$folder:$folder,"* ]]; then
        MOUNTS="$MOUNTS,$folder:$folder"
    fi
done
MOUNTS="$MOUNTS${EXTRA_MOUNTS:+,$EXTRA_MOUNTS}"
