#!/usr/bin/env bash
# The batch script slurm/submit_mmpo.sh hands sbatch: NeMo-RL's ray.sub, run unchanged as a
# child, and a watch over the job's other nodes. A lost node (its slurmd stops answering:
# network gone, node down, slurmd dead) ends the job within NODE_WATCH_PERIOD x
# NODE_WATCH_MISSES seconds plus ray.sub's stop (at most STOP_GRACE seconds), and the job's
# last output line names the node and the checkpoint the same command resumes from:
#   mmpo: node node2 lost (...); resume from checkpoint <dir>/step_2: submit the same command again
# Ray alone would leave the run to NeMo-RL (a gRPC traceback, or a wait for an actor pinned to
# the node), and Slurm would requeue a job whose node failed, to wait PENDING for a full
# allocation: submit_mmpo.sh passes --no-requeue, and the resubmitted command resumes from the
# newest checkpoint (NeMo-RL's checkpointing does that by itself).
#
# Inputs (environment, set by submit_mmpo.sh): MMPO_RAY_SUB (ray.sub's path on a shared
# filesystem), MMPO_CHECKPOINT_DIR (the run's checkpoint directory, relative to the submit
# directory or absolute), NODE_WATCH_PERIOD (seconds between probes, default 10),
# NODE_WATCH_MISSES (probes in a row a node may miss, default 3), STOP_GRACE (default 20).
set -uo pipefail

ray_sub="${MMPO_RAY_SUB:?the path of ray.sub, set by slurm/submit_mmpo.sh}"
checkpoint_dir="${MMPO_CHECKPOINT_DIR:-}"
period="${NODE_WATCH_PERIOD:-10}"
misses_allowed="${NODE_WATCH_MISSES:-3}"
stop_grace="${STOP_GRACE:-20}"
batch_host="$(hostname)"
slurmd_port="$(scontrol show config 2>/dev/null | awk '$1 == "SlurmdPort" {print $3}')"
slurmd_port="${slurmd_port:-6818}"
mapfile -t watched < <(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" | grep -vx "$batch_host")

latest_checkpoint() {  # the newest step_N directory NeMo-RL finished writing, or nothing
    [[ -n "$checkpoint_dir" && -d "$checkpoint_dir" ]] || return 0
    find "$checkpoint_dir" -maxdepth 1 -type d -name 'step_[0-9]*' -printf '%f\n' 2>/dev/null \
        | sort -t_ -k2 -n | tail -n 1 | sed "s|^|$checkpoint_dir/|"
}

resume_note() {
    local latest
    latest="$(latest_checkpoint)"
    if [[ -n "$latest" ]]; then
        echo "resume from checkpoint $latest: submit the same command again"
    elif [[ -z "$checkpoint_dir" ]]; then
        echo "the same command resumes from the newest checkpoint in checkpointing.checkpoint_dir"
    else
        echo "no checkpoint was written yet: the same command starts the run again"
    fi
}

node_address() { scontrol show node "$1" -o 2>/dev/null | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2; }

node_problem() {  # node_problem NODE: why NODE is lost (nothing if its slurmd answers)
    local state address
    state="$(scontrol show node "$1" -o 2>/dev/null | grep -o 'State=[^ ]*' | cut -d= -f2)"
    case "$state" in
        *DOWN* | *NOT_RESPONDING* | *FAIL*) echo "Slurm: $state" && return ;;
    esac
    address="$(node_address "$1")"
    if ! timeout 5 bash -c ": </dev/tcp/${address:-$1}/$slurmd_port" 2>/dev/null; then
        echo "its slurmd at ${address:-$1}:$slurmd_port does not answer"
    fi
}

declare -A missed=()
lost_node="" lost_why=""
probe_round() {  # one probe of every watched node; sets lost_node once one missed too often
    local node why
    for node in "${watched[@]}"; do
        why="$(node_problem "$node")"
        if [[ -z "$why" ]]; then
            missed[$node]=0
            continue
        fi
        missed[$node]=$((${missed[$node]:-0} + 1))
        if ((missed[$node] >= misses_allowed)); then
            lost_node="$node" lost_why="$why, ${missed[$node]} probes in a row"
            return
        fi
    done
}

descendants() {  # descendants PID: every process below PID, children first
    local child
    for child in $(pgrep -P "$1"); do
        echo "$child"
        descendants "$child"
    done
}

any_alive() {  # any_alive PID...: whether one of them still runs
    local pid
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && return 0; done
    return 1
}

stop_ray_sub() {  # TERM ray.sub and every process below it (its sruns), then KILL what is left
    # after STOP_GRACE seconds. The tree is taken before ray.sub goes: its sruns are orphaned
    # then, and one still waiting for its step would print "srun: error: ... Killed" after our
    # last line; we wait for them too, so that our line is the job's last.
    local tree deadline=$((SECONDS + stop_grace))
    tree="$(descendants "$ray_sub_pid" | tr '\n' ' ')"
    # shellcheck disable=SC2086 # a list of process ids
    kill -TERM "$ray_sub_pid" $tree 2>/dev/null
    # shellcheck disable=SC2086
    while any_alive "$ray_sub_pid" $tree && ((SECONDS < deadline)); do sleep 1; done
    tree="$tree $(descendants "$ray_sub_pid" | tr '\n' ' ')"
    # shellcheck disable=SC2086
    kill -KILL "$ray_sub_pid" $tree 2>/dev/null
    wait "$ray_sub_pid" 2>/dev/null
    # shellcheck disable=SC2086
    while any_alive $tree && ((SECONDS < deadline + 5)); do sleep 1; done
}

on_signal() {  # scancel, the time limit, or Slurm ending the job for a node it lost
    trap '' TERM INT
    stop_ray_sub
    probe_round
    if [[ -n "$lost_node" ]]; then
        echo "mmpo: node $lost_node lost ($lost_why); the job was stopped; $(resume_note)"
    else
        echo "mmpo: the job was stopped by a signal (scancel or its time limit); $(resume_note)"
    fi
    exit 143
}

bash "$ray_sub" &
ray_sub_pid=$!
trap on_signal TERM INT
while kill -0 "$ray_sub_pid" 2>/dev/null; do
    sleep "$period" &
    wait $! 2>/dev/null
    kill -0 "$ray_sub_pid" 2>/dev/null || break
    probe_round
    if [[ -n "$lost_node" ]]; then
        echo "mmpo: stopping ray.sub: node $lost_node lost ($lost_why)"
        stop_ray_sub
        echo "mmpo: node $lost_node lost ($lost_why); the job ended; $(resume_note)"
        exit 1
    fi
done
wait "$ray_sub_pid"
status=$?
if ((status == 0)); then
    echo "mmpo: ray.sub finished; newest checkpoint: $(latest_checkpoint)"
    exit 0
fi
# ray.sub failed on its own (the driver may have died of the lost node first): ask the nodes
# again while one of them misses, as often as the watch would have, before saying which.
any_missing() { local node; for node in "${watched[@]}"; do ((${missed[$node]:-0} > 0)) && return 0; done; return 1; }
for _ in $(seq "$misses_allowed"); do
    probe_round
    [[ -z "$lost_node" ]] && any_missing || break
    sleep "$period"
done
if [[ -n "$lost_node" ]]; then
    echo "mmpo: node $lost_node lost ($lost_why); ray.sub exited $status; $(resume_note)"
else
    echo "mmpo: ray.sub exited $status with every node answering (see ray-driver.log in ray.sub's log directory); $(resume_note)"
fi
exit "$status"
