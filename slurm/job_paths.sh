# Shared by slurm/submit_mmpo.sh and slurm/watch_mmpo.sh (source it): the paths a job sees.
# In: MMPO_DIR (this clone), WORK_DIR (where the run's relative paths start), CONFIG (a recipe),
# EXTRA_MOUNTS. Out: CONFIG absolute; MOUNTS, this clone, WORK_DIR and CONFIG's folder each
# mounted at the same path in the job (where a recipe's nemo_rl/ bases are the container's
# NeMo-RL's and its nemo_mmpo/ and base/ ones this clone's; nothing is copied into the clone).
# CONFIG, in this order: absolute (or ~/...); your file, relative to the folder you run the
# script from, when it is there; nemo_mmpo/<file>, one of this clone's recipes
# (nemo_mmpo/configs/<file>, as `nemo-mmpo train --config nemo_mmpo/<file>` names them), or
# examples/configs/<file>, the same file by its older name. Anything else: one line, exit 2.
requested_config="$CONFIG"
CONFIG="${CONFIG/#\~/$HOME}"
if [[ "$CONFIG" != /* ]]; then
    if [[ -f "$CONFIG" ]]; then  # yours wins, even where the clone has a file of that name
        CONFIG="$(cd "$(dirname "$CONFIG")" && pwd)/$(basename "$CONFIG")"
    elif [[ "$CONFIG" == nemo_mmpo/?* && -f "$MMPO_DIR/nemo_mmpo/configs/${CONFIG#nemo_mmpo/}" ]]; then
        CONFIG="$MMPO_DIR/nemo_mmpo/configs/${CONFIG#nemo_mmpo/}"
    elif [[ "$CONFIG" == examples/configs/?* && -f "$MMPO_DIR/$CONFIG" ]]; then
        CONFIG="$MMPO_DIR/$CONFIG"
    fi
fi
if [[ ! -f "$CONFIG" ]]; then
    if [[ "$requested_config" == /* || "$requested_config" == \~* ]]; then
        where="no such file"
    else
        where="not in $PWD, nor one of nemo-mmpo's recipes ($MMPO_DIR/nemo_mmpo/configs)"
    fi
    echo "CONFIG=$requested_config: $where; pass your recipe (absolute, or relative to the folder you submit from) or one of nemo-mmpo's as nemo_mmpo/<file>, e.g. CONFIG=nemo_mmpo/mmpo_math_qwen3_1.7b.yaml" >&2
    exit 2
fi
WORK_DIR="$(cd "$WORK_DIR" && pwd)"
MOUNTS="$MMPO_DIR:$MMPO_DIR"
for folder in "$WORK_DIR" "$(dirname "$CONFIG")"; do
    if [[ "$folder" != "$MMPO_DIR" && "$folder" != "$MMPO_DIR"/* && ",$MOUNTS," != *",$folder:$folder,"* ]]; then
        MOUNTS="$MOUNTS,$folder:$folder"
    fi
done
MOUNTS="$MOUNTS${EXTRA_MOUNTS:+,$EXTRA_MOUNTS}"
