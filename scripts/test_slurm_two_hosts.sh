#!/usr/bin/env bash
# The Slurm suite's two-host mode (scripts/test_slurm.sh calls it): a real Slurm with two hosts
# on this machine, and slurm/mmpo_multinode.sh across them through NeMo-RL's real ray.sub.
#
# Network: a bridge and three network namespaces (slurmctld's `ctl`, `node1`, `node2`) joined
# to it by veth pairs, on a private /24 of the test's own (SLURM_TEST_SUBNET, default
# 10.213.47); no default route in the namespaces and forwarding left as it is (off), so traffic
# stays between loopback and these addresses. Each node: its own network, UTS, PID and mount
# namespace (private /tmp and /dev/shm, its own /etc/hosts naming ctl, node1, node2) and slurmd
# (`nsenter --net` then `unshare`: `ip netns exec` remounts /sys and hides the cgroup tree
# slurmd needs). One munged serves all (its socket is a file). Teardown (trap EXIT) removes
# every process, namespace, veth and the bridge, also when a check fails.
#
# Per NeMo-RL checkout given (argument NEMO_RL_DIR:FAULT, FAULT `network` or `slurmd`):
#   1. the tiny recipe, 200 steps, NeMo-RL's math environment pinned to node2, checkpoint every
#      step; after step_2 node2 is lost (FAULT): its veth down, or its slurmd killed. The job
#      ends (slurm/ray_job.sh's node watch) with a last line naming node2 and the newest
#      checkpoint, FAILED or NODE_FAIL, never PENDING (submitted --no-requeue).
#   2. node2 restarted; the same command again: it resumes at the checkpoint after the one
#      named; node2's raylet is killed once the resumed run trained a step (ray.sub restarts it);
#      then ray status inside the job shows both nodes, node2's own Ray log shows the
#      environment actor, the run trains its steps in order to the last checkpoint, COMPLETED.
# The 200-step run is stopped by the fault, and the resumed one by grpo.max_num_steps, which a
# Hydra override lowers for the resubmission to STEPS_AFTER_RESUME steps past the checkpoint
# (CI's time); everything else is the same command.
#
# Usage: test_slurm_two_hosts.sh VENV NEMO_RL_DIR:FAULT...   (as root; prerequisites checked by
# scripts/test_slurm.sh). Prints "slurm two hosts <check>: ok|FAILED ..." lines; exits 1 if any
# failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
IN_CI="${CI:-false}"
VENV="$1"
shift
WORK="${SLURM_TEST_DIR:-/var/tmp/nemo-mmpo-slurm}-two-hosts"
CTLD_PORT="${SLURM_TEST_PORT:-6917}"
SUBNET="${SLURM_TEST_SUBNET:-10.213.47}"  # a /24 of the test's own
BRIDGE=mmpo-slurm-br
declare -A ADDRESS=([ctl]="$SUBNET.2" [node1]="$SUBNET.11" [node2]="$SUBNET.12")
GPUS=8         # each node's generic GPUs (links to /dev/null): the job claims them all for ray.sub
RECIPE_GPUS=2  # the recipe's cluster.gpus_per_node (GPUS_PER_NODE), fewer (slurm/partition_gpus.sh)
# the test's node watch: a node lost is named within 2 x (5 s + the 5 s probe) + 5 s to stop
WATCH="NODE_WATCH_PERIOD=5 NODE_WATCH_MISSES=2 STOP_GRACE=5"
LINE_BOUND=90  # seconds from the fault to the line, for a loaded 2-core machine (docs/slurm-ci.md)
STEPS_AFTER_RESUME=3
SEED="${SLURM_TEST_SEED:-0}"  # the recipe's seed (model, warm start, sampling)
failures=0
started=$SECONDS
# shellcheck source=scripts/slurm_test_lib.sh
source scripts/slurm_test_lib.sh

check() { report "two hosts $1" "${@:2}"; }  # the suite's line, with this mode's prefix

namespace_of() { echo "mmpo-slurm-$1"; }

# ------------------------------------------------------------------ teardown ---------------
remove_network() {  # our namespaces (their veth ends go with them) and the bridge, by name
    local name
    for name in ctl node1 node2; do
        ip netns delete "$(namespace_of "$name")" 2>/dev/null
        ip link delete "mmpo-v-$name" 2>/dev/null
    done
    ip link delete "$BRIDGE" 2>/dev/null
}

leftovers() {  # what teardown must have removed, one word each
    local name
    for name in ctl node1 node2; do
        [[ -e /run/netns/$(namespace_of "$name") ]] && echo "namespace:$(namespace_of "$name")"
        ip link show "mmpo-v-$name" >/dev/null 2>&1 && echo "veth:mmpo-v-$name"
        [[ -f "$WORK/run/$name-namespace.pid" ]] && echo "daemons:$name"
    done
    ip link show "$BRIDGE" >/dev/null 2>&1 && echo "bridge:$BRIDGE"
    [[ -f "$WORK/run/slurmctld.pid" ]] && echo "daemon:slurmctld"
    [[ -f "$WORK/run/munged.pid" ]] && echo "daemon:munged"
}

ray_said() {  # ray_said JOB: what the job's Ray said, for a failed check (printed, and kept in
    # $WORK): the last lines of ray.sub's head, worker and driver logs, and the warnings and
    # errors of each node's raylet and of the head's GCS, from the Ray logs ray.sub's log-sync
    # sidecar copies into the job's log folder every RAY_LOG_SYNC_FREQUENCY seconds (the nodes'
    # /tmp is private; ray.sub removes a failed attempt's session before the next)
    local logs="$WORK/jobs/$1-logs" file
    for file in "$logs"/ray-head.log "$logs"/ray-worker-*.log "$logs"/ray-driver.log; do
        [[ -f $file ]] || continue
        echo "slurm two hosts: job $1's ${file##*/}, its last lines:"
        grep -v '^+' "$file" | grep -v '^\s*$' | tail -n 8 | sed 's/^/    /'
    done
    for file in "$logs"/ray/*/logs/raylet.out "$logs"/ray/*/*/logs/raylet.out "$logs"/ray/*/logs/gcs_server.out; do
        [[ -f $file ]] || continue
        echo "slurm two hosts: job $1's ${file#"$logs"/}, its warnings and errors:"
        grep -E '^\[[^]]* [CEWF] [0-9]+ [0-9]+\]' "$file" | tail -n 6 |
            sed -E 's/An unexpected system state .* Check failed:/Check failed:/' | cut -c1-400 | sed 's/^/    /'
    done
}

teardown() {
    trap - EXIT INT TERM
    if [[ -n "${SLURM_CONF:-}" ]] && [[ -f "$SLURM_CONF" ]]; then
        timeout 10 scancel --quiet --user=root 2>/dev/null
    fi
    stop_recorded node1-namespace node2-namespace slurmctld munged
    remove_network
    [[ -n "${host_tmp:-}" ]] && rmdir "$host_tmp" 2>/dev/null
    [[ -n "${checkout_copy:-}" ]] && rm -rf "$(dirname "$checkout_copy")"
    left="$(leftovers | tr '\n' ' ')"
    check teardown "$([[ -z $left ]]; echo $?)" "left behind: $left" "no namespace, veth, bridge or daemon left"
    echo "slurm two hosts: $failures failed, $((SECONDS - started)) s"
    leave_cpu_group
    if [[ $failures -eq 0 ]]; then
        rm -rf "$WORK"
        exit 0
    fi
    echo "slurm two hosts: logs kept in $WORK"
    exit 1
}

# ------------------------------------------------------------------ network ----------------
for tool in ip nsenter unshare; do
    command -v "$tool" >/dev/null || skip_or_fail "the two-host mode needs $tool (iproute2, util-linux)"
done
unshare --net true 2>/dev/null || skip_or_fail "the two-host mode needs network namespaces (unshare --net failed)"
stop_recorded node1-namespace node2-namespace slurmctld munged 2>/dev/null  # an earlier run
remove_network
if ip -4 addr show | grep -q "inet $SUBNET\." || ip -4 route show | grep -q "^$SUBNET\."; then
    skip_or_fail "the subnet $SUBNET.0/24 is in use on this machine: set SLURM_TEST_SUBNET to a free one"
fi
rm -rf "$WORK"
mkdir -p "$WORK"/{etc,run,log,spool/ctld,dev,munge,jobs,runs}
enter_cpu_group  # (run alone; under scripts/test_slurm.sh it is in the group already)
trap teardown EXIT
# stopped from outside (a signal): a failure, its logs kept (it exited 0 with "0 failed" before)
trap 'check interrupted 1 "stopped by a signal before its checks ended"; exit 1' INT TERM

network_started=$SECONDS
{
    ip link add "$BRIDGE" type bridge &&
        ip addr add "$SUBNET.1/24" dev "$BRIDGE" && ip link set "$BRIDGE" up &&
        for name in ctl node1 node2; do
            namespace="$(namespace_of "$name")"
            ip netns add "$namespace" &&
                ip link add "mmpo-v-$name" type veth peer name eth0 netns "$namespace" &&
                ip link set "mmpo-v-$name" master "$BRIDGE" up &&
                ip -n "$namespace" addr add "${ADDRESS[$name]}/24" dev eth0 &&
                ip -n "$namespace" link set eth0 up && ip -n "$namespace" link set lo up || exit 1
        done
} >"$WORK/log/network.log" 2>&1
status=$?
routes="$(ip -n "$(namespace_of node1)" route show | tr '\n' ';')"
[[ $status -eq 0 && $routes != *default* ]]
check network $? "setup exit $status, node1's routes: $routes ($(tail -n 3 "$WORK/log/network.log"))" \
    "bridge $SUBNET.1/24, ctl ${ADDRESS[ctl]}, node1 ${ADDRESS[node1]}, node2 ${ADDRESS[node2]}; no default route; $((SECONDS - network_started)) s"
((failures == 0)) || exit 1

# ------------------------------------------------------------------ daemons ----------------
copy_checkout
build_gres_and_spank "$GPUS"
printf '127.0.0.1 localhost\n%s ctl\n%s node1\n%s node2\n' \
    "${ADDRESS[ctl]}" "${ADDRESS[node1]}" "${ADDRESS[node2]}" > "$WORK/etc/hosts"
CPUS="$(nproc)"
cat > "$WORK/etc/slurm.conf" <<CONF
ClusterName=nemo-mmpo-two-hosts
SlurmctldHost=ctl(${ADDRESS[ctl]})
SlurmctldPort=$CTLD_PORT
SlurmdPort=$((CTLD_PORT + 1))
SlurmdSpoolDir=$WORK/spool/%n
SlurmdPidFile=$WORK/log/slurmd-%n.pid
SlurmdLogFile=$WORK/log/slurmd-%n.log
# Slurm's own verdict on a node that stops answering (its default is 300 s); the job's node
# watch (slurm/ray_job.sh) is faster
SlurmdTimeout=30
$(slurm_conf_common)
NodeName=node1 NodeAddr=${ADDRESS[node1]} CPUs=$CPUS Gres=gpu:$GPUS State=UNKNOWN
NodeName=node2 NodeAddr=${ADDRESS[node2]} CPUs=$CPUS Gres=gpu:$GPUS State=UNKNOWN
PartitionName=mmpo Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
CONF
echo "NodeName=node[1-2] Name=gpu File=$WORK/dev/nvidia[0-$((GPUS - 1))]" > "$WORK/etc/gres.conf"
export SLURM_CONF="$WORK/etc/slurm.conf"

start_munged
# slurmctld in ctl's network namespace with the hostname `ctl` (it checks SlurmctldHost)
nsenter --net="/run/netns/$(namespace_of ctl)" unshare --uts --mount --propagation private \
    bash -c 'hostname ctl && mount --bind "$1" /etc/hosts && exec slurmctld -D -f "$2"' ctl \
    "$WORK/etc/hosts" "$SLURM_CONF" >>"$WORK/log/slurmctld.out" 2>&1 &
echo $! > "$WORK/run/slurmctld.pid"
disown

host_tmp="$(mktemp -d /var/tmp/nemo-mmpo-slurm-host-tmp.XXXXXX)"
mapfile -t kept_under_tmp < <(paths_under_tmp "$ROOT" "$checkout_copy" "$VENV" "$WORK" "${@%%:*}")
start_node() {  # start_node NODE: its namespaces and slurmd (recorded as NODE-namespace)
    nsenter --net="/run/netns/$(namespace_of "$1")" \
        unshare --uts --pid --fork --kill-child --mount-proc --mount --propagation private \
        bash -c "$NODE_NAMESPACE_BODY" "$1-namespace" "$1" "$SLURM_CONF" "$host_tmp" \
        "$WORK/etc/hosts" "$1" "${kept_under_tmp[@]}" >>"$WORK/log/$1.out" 2>&1 &
    echo $! > "$WORK/run/$1-namespace.pid"
    disown
}
node_init() { pgrep -P "$(cat "$WORK/run/$1-namespace.pid")" | head -n 1; }  # the namespace's bash
start_node node1
start_node node2
nodes_idle() { [[ "$(sinfo -h -N -o '%N %T %G' 2>/dev/null | sort | tr '\n' ' ')" == "node1 idle gpu:$GPUS node2 idle gpu:$GPUS " ]]; }
daemons_started=$SECONDS
if wait_until 60 nodes_idle; then
    check daemons 0 "" "node1, node2 idle with gpu:$GPUS after $((SECONDS - daemons_started)) s"
else
    check daemons 1 "not both idle after 60 s: $(sinfo -h -N -o '%N %T %G %E' 2>&1 | tr '\n' ';')"
    tail -n 20 "$WORK"/log/*.log "$WORK"/log/*.out 2>/dev/null
    exit 1
fi
hosts_out="$(timeout 30 srun --quiet -N2 hostname 2>&1 | sort | tr '\n' ' ')"
[[ $hosts_out == "node1 node2 " ]]
check "srun -N2" $? "printed: $hosts_out" "node1 node2"

# ------------------------------------------------------------------ jobs -------------------
# The tiny recipe with NeMo-RL's math environment on node2 (Ray's own `node:<address>`
# resource; a Hydra override cannot name a key with a colon), beside the recipes of the
# checkout's copy (their NeMo-RL configs resolve there)
cat > "$checkout_copy/examples/configs/mmpo_tiny_cpu_two_hosts.yaml" <<YAML
defaults: mmpo_tiny_cpu.yaml
cpu_backend:
  placement:
    environment:
      resources:
        "node:${ADDRESS[node2]}": 0.01
YAML
namespace_pids() {  # namespace_pids NODE NAME: the PIDs of processes called NAME in NODE's namespace
    local init namespace pid
    init="$(node_init "$1")"
    namespace="$(readlink "/proc/$init/ns/pid")"
    for pid in /proc/[0-9]*; do
        pid="${pid#/proc/}"
        [[ "$(readlink "/proc/$pid/ns/pid" 2>/dev/null)" == "$namespace" &&
            "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$2" ]] && echo "$pid"
    done
}

submit_multinode() {  # submit_multinode NEMO_RL RUN OVERRIDES...: mmpo_multinode.sh's output
    local nemo_rl="$1" run="$2" job_env
    shift 2
    # ray.sub's log-sync sidecar: each node's Ray logs, every attempt's, in the job's log folder
    # (ray_said reads them when a check fails)
    job_env="$(job_env_for "$nemo_rl") $WATCH RAY_LOG_SYNC_FREQUENCY=20"
    SBATCH_OUTPUT="$WORK/jobs/slurm-%j.out" \
    ACCOUNT=mmpo PARTITION=mmpo GPUS_PER_NODE=$RECIPE_GPUS TIME=00:15:00 \
    NEMO_RL_HOST_DIR="$nemo_rl" NEMO_RL_DIR="$nemo_rl" PYTHON="$VENV/bin/python" \
    PYTHON_LAUNCHER="$VENV/bin/python" JOB_ENV="$job_env" WORK_DIR="$checkout_copy" JOB_NAME="mmpo-two-hosts-$run" \
    CONFIG=examples/configs/mmpo_tiny_cpu_two_hosts.yaml \
        timeout 300 bash "$checkout_copy/slurm/mmpo_multinode.sh" \
        grpo.val_period=0 grpo.val_at_start=false evaluation.enabled=false \
        checkpointing.save_period=1 checkpointing.keep_top_k=1000 \
        "checkpointing.checkpoint_dir=$WORK/runs/$run/checkpoints" \
        "logger.log_dir=$WORK/runs/$run/logs" \
        "cpu_backend.warm_start_cache=$WORK/warm_starts" \
        cpu_backend.warm_start.target_low=0.0 cpu_backend.warm_start.target_high=1.0 \
        cpu_backend.warm_start.check_every=1 cpu_backend.warm_start.check_prompts=16 \
        "cpu_backend.seed=$SEED" "$@" >>"$WORK/log/submit-$run.log" 2>&1
}
newest_step() {  # the newest step_N under a checkpoint directory: N, or nothing
    find "$1" -maxdepth 1 -type d -name 'step_[0-9]*' -printf '%f\n' 2>/dev/null \
        | sed 's/^step_//' | sort -n | tail -n 1
}
logged_steps() { grep -o '^step  *[0-9]*/' "$1" 2>/dev/null | grep -o '[0-9]*' | tr '\n' ' '; }
last_id() { grep -o 'Submitted batch job [0-9]*' "$WORK/log/submit-$1.log" | tail -n 1 | grep -o '[0-9]*$'; }

lose_node2() {  # lose_node2 FAULT
    case "$1" in
        network) ip link set mmpo-v-node2 down ;;
        slurmd) kill -9 "$(namespace_pids node2 slurmd)" ;;
    esac
}

restart_node2() {  # node2 back whole: a new namespace (the old one's processes die), its link up
    stop_recorded node2-namespace
    ip link set mmpo-v-node2 up
    start_node node2
    wait_until 90 nodes_idle
}

run_snapshot() {  # run_snapshot NEMO_RL FAULT: the fault run, then its resubmission
    local nemo_rl="$1" fault="$2" label run job job2 out logs state line newest restarts checkpoints lost_at
    label="$(basename "$nemo_rl" | sed 's/^nemo-rl-//'), $fault"
    run="run-$(basename "$nemo_rl")"
    checkpoints="$WORK/runs/$run/checkpoints"

    # 1. the fault run
    submit_multinode "$nemo_rl" "$run" grpo.max_num_steps=200
    job="$(last_id "$run")"
    if [[ -z "$job" ]]; then
        check "$label: submitted" 1 "$(tail -n 5 "$WORK/log/submit-$run.log")"
        return
    fi
    out="$WORK/jobs/slurm-$job.out"
    # (waits are generous: a 2-core machine at load 25 took over 4 minutes to reach step_2)
    has_step_2() { [[ -d "$checkpoints/step_2" ]] || job_ended "$job"; }
    if ! wait_until 600 has_step_2 || [[ ! -d "$checkpoints/step_2" ]]; then
        check "$label: step_2 before the fault" 1 "job $job: $(job_state "$job"), no $checkpoints/step_2 after 600 s; $(tail -n 3 "$out" | tr '\n' ' ')"
        ray_said "$job"
        return
    fi
    lost_at=$SECONDS
    lose_node2 "$fault"
    # the job's batch script has ended: the line is out, the job off RUNNING (COMPLETING
    # until Slurm hears from node2 again or declares it down)
    line_out() { grep -q '^mmpo: node\|^mmpo: ray.sub' "$out" 2>/dev/null && ! [[ "$(job_state "$job")" =~ ^(RUNNING|PENDING|CONFIGURING)$ ]]; }
    wait_until 240 line_out
    ended_after=$((SECONDS - lost_at))
    line="$(grep -v '^\s*$' "$out" 2>/dev/null | tail -n 1)"
    newest="$(newest_step "$checkpoints")"
    [[ $line == "mmpo: node node2 lost"*"resume from checkpoint $checkpoints/step_$newest: submit the same command again" ]]
    check "$label: last line names node2 and the checkpoint" $? "last line: $line (newest checkpoint: step_${newest:-none})" "$line"
    ((ended_after <= LINE_BOUND))
    check "$label: job ended in bounded time" $? "$ended_after s from the fault to the line (bound $LINE_BOUND s)" "$ended_after s after node2 was lost (bound $LINE_BOUND s)"
    # both gpu:8 nodes claimed whole for ray.sub (sbatch's --gres), the recipe's 2 a node used
    local claim_said tres cluster
    claim_said="$(grep '^partition mmpo: ' "$WORK/log/submit-$run.log" | tail -n 1)"
    tres="$(job_field "$job" TresPerNode)"
    cluster="$("$VENV/bin/python" -c 'import sys, yaml; c = yaml.safe_load(open(sys.argv[1]))["cluster"]; print(c["num_nodes"], c["gpus_per_node"])' \
        "$checkpoints/step_2/config.yaml" 2>&1 | tail -n 1)"
    [[ $claim_said == "partition mmpo: nodes have gpu:$GPUS; claiming $GPUS a node for ray.sub, the recipe uses $RECIPE_GPUS" &&
        $tres == *"gpu:$GPUS" && $cluster == "2 $RECIPE_GPUS" ]]
    check "$label: gpu:$GPUS nodes claimed whole, $RECIPE_GPUS-GPU recipe" $? \
        "said: ${claim_said:-nothing}; job TresPerNode=${tres:-none}; recipe's cluster (num_nodes gpus_per_node): $cluster" \
        "TresPerNode=$tres; cluster.num_nodes, gpus_per_node: $cluster"

    # 2. node2 back (Slurm's verdict on the lost job is final then), the same command again
    restart_node2
    state="$(job_state "$job")"
    restarts="$(job_field "$job" Restarts)"
    [[ ($state == FAILED || $state == NODE_FAIL) && $restarts == 0 && -z "$(squeue -h -j "$job" -o %T 2>/dev/null)" ]]
    check "$label: not requeued, not PENDING" $? "job $job: $state, restarts ${restarts:-?}, queue: $(squeue -h -o '%i %T %r' | tr '\n' ';')" \
        "job $job $state, restarts 0, off the queue"
    submit_multinode "$nemo_rl" "$run" "grpo.max_num_steps=$((newest + STEPS_AFTER_RESUME))"
    job2="$(last_id "$run")"
    if [[ -z "$job2" || $job2 == "$job" ]]; then
        check "$label: resubmitted" 1 "$(tail -n 5 "$WORK/log/submit-$run.log")"
        return
    fi
    logs="$WORK/jobs/$job2-logs"
    local failures_before=$failures
    # once the driver runs (ray.sub waits for every node first): ray status from inside the job,
    # then node2's raylet killed before the resumed run's first step (every step calls the
    # environment on node2: the run waits for ray.sub to restart the raylet)
    driver_started() { grep -q 'resuming from' "$logs/ray-driver.log" 2>/dev/null || job_ended "$job2"; }
    wait_until 600 driver_started
    ray_status="$(timeout 60 srun --jobid="$job2" --overlap -N1 -n1 -w node1 "$VENV/bin/ray" status 2>&1)"
    ray_nodes="$(grep -c '^ *1 node_' <<< "$ray_status")"
    steps_before_kill="$(logged_steps "$logs/ray-driver.log")"
    raylets="$(namespace_pids node2 raylet | tr '\n' ' ')"
    # shellcheck disable=SC2086 # a list of process ids
    [[ -n "$raylets" ]] && kill -9 $raylets
    wait_until 600 job_ended "$job2"
    state="$(job_state "$job2")"
    [[ $ray_nodes -eq 2 ]]
    check "$label: ray status shows both nodes" $? "ray status inside job $job2: $ray_nodes active nodes: $(tail -n 5 <<< "$ray_status" | tr '\n' ' ')" "2 active nodes"
    node2_root="/proc/$(node_init node2)/root"  # node2's private /tmp, as its processes see it
    session="$node2_root$(readlink "$node2_root/tmp/ray/session_latest")"
    on_node2="$(grep -l '^:actor_name:MathEnvironment' "$session"/logs/worker-*.out 2>/dev/null | head -n 1)"
    [[ -n "$on_node2" ]]
    check "$label: environment actor ran on node2" $? "no MathEnvironment in node2's own Ray logs" "${on_node2#"$node2_root"}"
    steps="$(logged_steps "$logs/ray-driver.log")"
    wanted="$(seq $((newest + 1)) $((newest + STEPS_AFTER_RESUME)) | tr '\n' ' ')"
    final="$(newest_step "$checkpoints")"
    [[ $steps == "$wanted" && $final == $((newest + STEPS_AFTER_RESUME)) ]]
    check "$label: resumed at step $((newest + 1)), no step twice or lost" $? \
        "checkpoint step_$newest, resumed run logged steps [$steps] (wanted [$wanted]), newest checkpoint step_$final" \
        "steps ${steps% } after step_$newest; checkpoint step_$final"
    rejoined="$(grep -c 'starting Ray worker (attempt [2-9]' "$logs"/ray-worker-*.log 2>/dev/null)"
    [[ $state == COMPLETED && -n "$raylets" && -z "$steps_before_kill" && $rejoined -ge 1 ]]
    check "$label: node2's raylet killed, job COMPLETED" $? \
        "job $job2: $state, raylet pids [${raylets}] killed after steps [$steps_before_kill], worker restarts $rejoined; $(tail -n 3 "$WORK/jobs/slurm-$job2.out" | tr '\n' ' ')" \
        "job $job2 COMPLETED; ray.sub restarted node2's worker"
    ((failures == failures_before)) || ray_said "$job2"
}

for snapshot_and_fault in "$@"; do
    run_snapshot "${snapshot_and_fault%%:*}" "${snapshot_and_fault##*:}"
done
exit 0  # teardown reports and sets the status
