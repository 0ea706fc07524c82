#!/usr/bin/env bash
# slurm/submit_mmpo.sh against a real Slurm on this machine: Debian's slurm-wlm (slurmctld,
# slurmd, munged, loopback only, one node with a generic `gpu` GRES) is installed if needed,
# started from a private config directory, and torn down at exit. srun accepts pyxis's container
# options through a stand-in SPANK plugin (slurm/test/pyxis_standin.c, built here) and runs every
# step on the host. The tiny CPU recipe, shortened, goes through NeMo-RL's real ray.sub. The node
# declares gpu:8 and the recipe uses 2: the job claims the whole node, as ray.sub insists
# (slurm/partition_gpus.sh). Two nodes that never start (DOWN) make two more partitions: `mixed`
# (gpu:8 and gpu:4, refused before queuing) and `plain` (no GPU GRES, submitted without --gres).
# Prints one line per check, "slurm <check>: ok|FAILED <detail>"; exits 1 if any failed.
#
# Needs root (it starts the daemons) and apt (to install them); elsewhere it says why and skips,
# and under CI=true a missing prerequisite is a failure. Uses NeMo-RL's environment and v0.7.0
# snapshot as scripts/test_nemo_rl.sh does (built by `bash scripts/test.sh`).
#
# slurmd (and so every job) runs in its own PID and mount namespace with private /tmp and
# /dev/shm: ray.sub runs `ray stop` (every Ray process on the machine it can see) and
# `rm -rf /tmp/ray/session_*`, which must not reach Ray clusters that other work runs here.
# Killing the namespace's first process at the end kills whatever a job left behind. The paths
# the jobs need that lie under /tmp (the checkout, NeMo-RL's environment and checkout, the work
# folder) are bound back into the private /tmp, so a checkout under /tmp works. The jobs are
# submitted from a copy of the working tree made under /tmp (mktemp -d), so every run of the
# suite tests that case, wherever the checkout lives.
#
# Then the two-host mode (scripts/test_slurm_two_hosts.sh, its header says what it checks):
# slurm/mmpo_multinode.sh across two slurmd hosts in network namespaces on a private subnet,
# node2 lost mid-run, the same command resubmitted; on each NeMo-RL snapshot (their ray.sub
# differ). Its lines read "slurm two hosts <check>: ok|FAILED <detail>".
#
# Settings (environment):
#   SLURM_TEST_DIR   state, logs and the runs' outputs (default /var/tmp/nemo-mmpo-slurm; removed
#                    at the end when every check passed, kept for reading otherwise)
#   SLURM_TEST_PORT  slurmctld's port; slurmd uses the next one (default 6917)
#   SLURM_TEST_SUBNET the two-host mode's private /24, its first three numbers (default 10.213.47)
#   SLURM_TEST_SEED  the two-host runs' cpu_backend.seed (default 0)
#   SLURM_TEST_CPU_WEIGHT  the suite's CPU cgroup weight, in sessions' (default 4; 0: no group;
#                    scripts/slurm_test_lib.sh, enter_cpu_group, says why it is there)
#   NEMO_MMPO_SLURM_TWO_HOSTS  the two-host sequences: all (default), v0.7.0 or main; under
#                    CI=true one a commit (v0.7.0 on an even number of commits, main on an odd)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
IN_CI="${CI:-false}"
# the two-host sequences to run (below): all, v0.7.0 or main; CI: one a commit
two_hosts_choice="${NEMO_MMPO_SLURM_TWO_HOSTS:-}"
if [[ -z "$two_hosts_choice" ]]; then
    two_hosts_choice=all
    if [[ "$IN_CI" == "true" ]]; then
        two_hosts_choice=v0.7.0
        (($(git rev-list --count HEAD 2>/dev/null || echo 0) % 2 == 1)) && two_hosts_choice=main
    fi
fi
case "$two_hosts_choice" in
    all | v0.7.0 | main) ;;
    *)
        echo "slurm suite: NEMO_MMPO_SLURM_TWO_HOSTS=$two_hosts_choice is not one of all, v0.7.0, main: unset it (all) or pick one"
        exit 2
        ;;
esac
WORK="${SLURM_TEST_DIR:-/var/tmp/nemo-mmpo-slurm}"
CTLD_PORT="${SLURM_TEST_PORT:-6917}"
NODE=localhost       # resolves to 127.0.0.1 everywhere; ray.sub resolves node names to addresses
GPUS=8               # the node's generic GPUs (device files are links to /dev/null)
RECIPE_GPUS=2        # the recipe's cluster.gpus_per_node (GPUS_PER_NODE): fewer than the node's
PACKAGES=(slurm-wlm munge libslurm-dev libpmix2 libpmix-dev gcc libc6-dev iproute2 util-linux)
started=$SECONDS
failures=0

# shellcheck source=scripts/slurm_test_lib.sh
source scripts/slurm_test_lib.sh

# ------------------------------------------------------------------ prerequisites ----------
[[ $EUID -eq 0 ]] || skip_or_fail "needs root (it starts slurmctld, slurmd and munged)"
missing=()
for package in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "slurm suite: installing ${missing[*]}"
    # installed only: the daemons used here are started below, from a private config
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends "${missing[@]}"; } >/tmp/nemo-mmpo-slurm-apt.log 2>&1; then
        skip_or_fail "apt-get could not install ${missing[*]} (see /tmp/nemo-mmpo-slurm-apt.log)"
    fi
fi
# shellcheck source=scripts/nemo_rl_env.sh
source scripts/nemo_rl_env.sh
if [[ -n "${NEMO_RL_PATH:-}" ]]; then
    nemo_rl="$(cd "$NEMO_RL_PATH" && pwd)"
elif nemo_rl_snapshot_refs | grep -qx "v0.7.0"; then
    nemo_rl="$(nemo_rl_unpack v0.7.0)"
else
    skip_or_fail "no NeMo-RL v0.7.0 snapshot in $NEMO_RL_SNAPSHOTS and NEMO_RL_PATH is unset"
fi
[[ -f "$nemo_rl/ray.sub" ]] || skip_or_fail "$nemo_rl has no ray.sub"
python="$(nemo_rl_python)"
[[ -n "$python" ]] || skip_or_fail "no Python 3.13 found (NeMo-RL's); set NEMO_RL_PYTHON"
nemo_rl_environment "$python" >/dev/null
VENV="$NEMO_RL_VENV"

enter_cpu_group  # the daemons and the jobs weighted above the rest of CI (scripts/slurm_test_lib.sh)

# ------------------------------------------------------------------ teardown ---------------
# Daemons are started here and stopped by their PIDs (recorded in $WORK/run), also those a
# killed earlier run left behind: nothing else on the machine is touched.
teardown() {
    if [[ -n "${SLURM_CONF:-}" ]] && [[ -f "$SLURM_CONF" ]]; then
        scancel --quiet --user=root 2>/dev/null  # every job of this private cluster
    fi
    stop_recorded slurmd-namespace slurmctld munged  # the namespace first: its init's death kills every process in it
    [[ -n "${host_tmp:-}" ]] && rmdir "$host_tmp" 2>/dev/null  # mounted inside the namespace only
    [[ -n "${checkout_copy:-}" ]] && rm -rf "$(dirname "$checkout_copy")"
    if [[ $failures -eq 0 ]]; then
        rm -rf "$WORK"
    else
        echo "slurm suite: logs kept in $WORK"
    fi
}

# ------------------------------------------------------------------ setup ------------------
stop_recorded slurmd-namespace slurmctld munged 2>/dev/null  # a run killed before its teardown
rm -rf "$WORK"
mkdir -p "$WORK"/{etc,run,log,spool/ctld,spool/d,dev,munge,jobs,runs}
trap teardown EXIT

# The jobs run from a copy of the working tree under /tmp (mktemp -d); it imports its own
# nemo_mmpo (examples/run_mmpo_math.py puts its repository first on the path).
copy_checkout

build_gres_and_spank "$GPUS"

CPUS="$(nproc)"
cat > "$WORK/etc/slurm.conf" <<CONF
ClusterName=nemo-mmpo-test
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$((CTLD_PORT + 1))
SlurmdSpoolDir=$WORK/spool/d
SlurmdPidFile=$WORK/log/slurmd.pid
SlurmdLogFile=$WORK/log/slurmd.log
$(slurm_conf_common)
# never started (nothing listens on their ports): two more partitions' GRES, as sinfo reads them.
# Before $NODE: while the only node so far is localhost, Slurm 22.05 finds every name as it
# ("Duplicated NodeHostName gpu4 in config file").
NodeName=gpu4 NodeAddr=127.0.0.1 Port=$((CTLD_PORT + 2)) CPUs=1 Gres=gpu:4 State=DOWN Reason=never-started
NodeName=nogpu NodeAddr=127.0.0.1 Port=$((CTLD_PORT + 3)) CPUs=1 State=DOWN Reason=never-started
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS Gres=gpu:$GPUS State=UNKNOWN
PartitionName=mmpo Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=mixed Nodes=$NODE,gpu4 MaxTime=INFINITE State=UP
PartitionName=plain Nodes=nogpu MaxTime=INFINITE State=UP
CONF
echo "NodeName=$NODE Name=gpu File=$WORK/dev/nvidia[0-$((GPUS - 1))]" > "$WORK/etc/gres.conf"
export SLURM_CONF="$WORK/etc/slurm.conf"

start_munged
slurmctld -D -f "$SLURM_CONF" >>"$WORK/log/slurmctld.out" 2>&1 &
echo $! > "$WORK/run/slurmctld.pid"
disown
# slurmd in its own PID and mount namespace (see the header; slurm_test_lib.sh's
# NODE_NAMESPACE_BODY); --kill-child kills the namespace when unshare is killed.
host_tmp="$(mktemp -d /var/tmp/nemo-mmpo-slurm-host-tmp.XXXXXX)"
mapfile -t kept_under_tmp < <(paths_under_tmp "$ROOT" "$checkout_copy" "$nemo_rl" "$VENV" "$WORK")
unshare --pid --fork --kill-child --mount-proc --mount --propagation private bash -c \
    "$NODE_NAMESPACE_BODY" slurmd-namespace "$NODE" "$SLURM_CONF" "$host_tmp" "" "" \
    "${kept_under_tmp[@]}" >>"$WORK/log/slurmd.out" 2>&1 &
echo $! > "$WORK/run/slurmd-namespace.pid"
disown

node_idle() { [[ "$(sinfo -h -N -n "$NODE" -o '%T %G' 2>/dev/null)" == "idle gpu:$GPUS"* ]]; }
if wait_until 60 node_idle; then
    report daemons 0 "" "munged, slurmctld, slurmd; node $NODE idle with gpu:$GPUS, $CPUS CPUs"
else
    report daemons 1 "node not idle after 60 s: $(sinfo -h -N -o '%T %G %E' 2>&1 | head -n 3)"
    tail -n 20 "$WORK"/log/*.log "$WORK"/log/*.out 2>/dev/null
    exit 1
fi

# ------------------------------------------------------------------ checks -----------------
# srun with the options ray.sub passes (pyxis's, and --mpi=pmix) runs on the host. The checks'
# sruns are --quiet: a step that waits for the previous one's resources prints "srun: job N
# queued and waiting for resources" (seen under CI's load, fresh-clone CI of 59155e8), which is
# not the job's output; errors still print.
spank_out="$(timeout 60 srun --quiet -N1 -n1 --gres=gpu:$GPUS --mpi=pmix --no-container-mount-home \
    --container-image=nvcr.io/nvidia/nemo-rl:v0.7.0 --container-mounts="$checkout_copy:$checkout_copy" \
    --container-workdir="$checkout_copy" --container-name=ray-head bash -c 'echo "host=$(hostname) gpus=$CUDA_VISIBLE_DEVICES"' 2>&1)"
report "srun with pyxis options" $? "$spank_out" "$spank_out"

# A job sees the checkout under /tmp (its working directory) and NeMo-RL's `ray`, yet not this
# machine's /tmp: a marker file left there stays invisible inside the job.
marker="$(mktemp /tmp/nemo-mmpo-slurm-marker.XXXXXX)"
tmp_out="$(timeout 60 srun --quiet -N1 -n1 --chdir="$checkout_copy" bash -c \
    "test -f slurm/submit_mmpo.sh && PATH=$VENV/bin:\$PATH command -v ray >/dev/null && echo checkout-and-ray-seen; if test -e $marker; then echo marker-seen; fi" 2>&1)"
rm -f "$marker"
[[ $tmp_out == checkout-and-ray-seen ]]
report "checkout under /tmp seen by jobs" $? "job said: $tmp_out (wanted checkout-and-ray-seen, and no marker-seen)" "$checkout_copy; private /tmp"

job_env="$(job_env_for "$nemo_rl")"
# The recipe, shortened. Its warm start stops at its first check (the band is [0, 1]): this
# tests the submission path, not learning (tests/cpu/test_tiny_run.py does), in CI's budget.
submit() {  # submit RUN_NAME OVERRIDES...: slurm/submit_mmpo.sh's output in $WORK/log/submit-RUN
    # (SUBMIT_PARTITION, SUBMIT_GPUS: PARTITION and GPUS_PER_NODE, default mmpo and RECIPE_GPUS)
    local run="$1"
    shift
    SBATCH_OUTPUT="$WORK/jobs/slurm-%j.out" \
    ACCOUNT=mmpo PARTITION="${SUBMIT_PARTITION:-mmpo}" NUM_NODES=1 GPUS_PER_NODE="${SUBMIT_GPUS:-$RECIPE_GPUS}" TIME=00:15:00 \
    NEMO_RL_HOST_DIR="$nemo_rl" NEMO_RL_DIR="$nemo_rl" PYTHON="$VENV/bin/python" \
    PYTHON_LAUNCHER="$VENV/bin/python" JOB_ENV="$job_env" WORK_DIR="$checkout_copy" JOB_NAME="mmpo-test-$run" \
    CONFIG=nemo_mmpo/mmpo_tiny_cpu.yaml \
        timeout 120 bash "$checkout_copy/slurm/submit_mmpo.sh" \
        grpo.val_period=0 grpo.val_at_start=false evaluation.enabled=false \
        checkpointing.save_period=3 \
        "checkpointing.checkpoint_dir=$WORK/runs/$run/checkpoints" \
        "logger.log_dir=$WORK/runs/$run/logs" \
        "cpu_backend.warm_start_cache=$WORK/warm_starts" \
        cpu_backend.warm_start.target_low=0.0 cpu_backend.warm_start.target_high=1.0 \
        cpu_backend.warm_start.check_every=1 cpu_backend.warm_start.check_prompts=16 \
        "$@" >"$WORK/log/submit-$run.log" 2>&1
}
# A typo in an override is refused before anything is queued.
before="$(job_ids)"
submit refused grpo.max_num_steps=3 grpo.adv_estimator.name=mmpoo
status=$?
after="$(job_ids)"
queued="$(squeue -h -o %i | wc -l)"
if [[ $status -eq 2 ]] && grep -q "Not submitted" "$WORK/log/submit-refused.log" \
        && [[ "$before" == "$after" && $queued -eq 0 ]]; then
    report "bad override refused" 0 "" "exit 2, no job queued"
else
    report "bad override refused" 1 "exit $status, jobs before [$before] after [$after], queued $queued; $(tail -n 3 "$WORK/log/submit-refused.log")"
fi

# What ray.sub cannot run is refused in one line before anything is queued, from the partition's
# GRES as sinfo reads it on the login node: nodes with different GPU counts (ray.sub claims one
# count on every node), a recipe asking more GPUs than a node has.
refused_in_one_line() {  # refused_in_one_line CHECK RUN WANTED: exit 2, the last line WANTED...,
    # after the recipe's line only; no job queued
    local before after status said
    before="$(job_ids)"
    submit "$2" grpo.max_num_steps=3
    status=$?
    after="$(job_ids)"
    said="$(grep -v '^recipe: ' "$WORK/log/submit-$2.log")"
    [[ $status -eq 2 && "$said" == "$3"* && "$said" != *$'\n'* && "$before" == "$after" ]]
    report "$1" $? "exit $status, jobs before [$before] after [$after]; said: $said" "$said"
}
SUBMIT_PARTITION=mixed refused_in_one_line "gpu:8 and gpu:4 nodes refused before queuing" mixed \
    "Not submitted: partition mixed's nodes have different GPU counts (gpu:4, gpu:8)"
SUBMIT_GPUS=16 refused_in_one_line "16 GPUs on gpu:8 nodes refused before queuing" too-many \
    "Not submitted: GPUS_PER_NODE=16 but partition mmpo's nodes have gpu:8; set GPUS_PER_NODE to 8 or fewer"

# A partition whose nodes declare no GPU GRES: submitted without --gres, as ray.sub runs there
# (sbatch refuses --gres on it: the scripts passed one before). Its node never starts: the job
# waits, and is cancelled.
SUBMIT_PARTITION=plain submit plain grpo.max_num_steps=3
job="$(submitted_id plain)"
gres_refused="$(timeout 30 sbatch --partition=plain --gres=gpu:$RECIPE_GPUS --output=/dev/null --wrap=true 2>&1)"
plain_said="$(grep '^partition plain: ' "$WORK/log/submit-plain.log")"
tres="$(job_field "${job:-none}" TresPerNode)"
[[ -n "$job" && -z "$tres" && "$plain_said" == "partition plain: its nodes declare no GPU GRES; submitting without --gres"* &&
    "$gres_refused" == *"Requested node configuration is not available"* ]]
report "no GPU GRES: submitted without --gres" $? \
    "job ${job:-none} (TresPerNode=${tres:-none}), said: ${plain_said:-nothing}; sbatch --gres there: $gres_refused" \
    "job $job queued without --gres; sbatch refuses --gres there"
[[ -n "$job" ]] && scancel "$job"

# The recipe, shortened, through ray.sub: Ray started by ray.sub, our entry point's check, three
# steps of NeMo-RL's grpo_train, a checkpoint; the job ends COMPLETED. transform_alpha is a key
# the plug-in estimator does not read: named once in the run's log (the plan, not again when
# NeMo-RL builds the estimator).
submit train grpo.max_num_steps=3 grpo.adv_estimator.transform_alpha=0.5
job="$(submitted_id train)"
# CONFIG=nemo_mmpo/<file>, submitted from this checkout (which has no such file): the package's
# recipe of the clone that submits, the copy under /tmp, not this checkout's
grep -qx "recipe: $checkout_copy/nemo_mmpo/configs/mmpo_tiny_cpu.yaml (relative paths from $checkout_copy)" \
    "$WORK/log/submit-train.log"
report "nemo_mmpo/<file> is the submitting clone's recipe" $? "$(grep '^recipe: ' "$WORK/log/submit-train.log")"
if [[ -z "$job" ]]; then
    report "job submitted" 1 "$(tail -n 5 "$WORK/log/submit-train.log")"
else
    job_started=$SECONDS
    wait_until 240 job_ended "$job"
    state="$(job_state "$job")"
    logs="$WORK/jobs/$job-logs"
    driver_log="$logs/ray-driver.log"
    report "job COMPLETED" "$([[ $state == COMPLETED ]]; echo $?)" \
        "job $job: $state; $(tail -n 5 "$driver_log" 2>/dev/null | tr '\n' ' ')" \
        "job $job, $((SECONDS - job_started)) s from submission to COMPLETED"
    # the gpu:8 node claimed whole (sbatch's --gres, ray.sub's GPUS_PER_NODE), the recipe's 2 used
    claim_said="$(grep '^partition mmpo: ' "$WORK/log/submit-train.log")"
    tres="$(job_field "$job" TresPerNode)"
    recipe_gpus="$("$VENV/bin/python" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["cluster"]["gpus_per_node"])' \
        "$WORK/runs/train/checkpoints/step_3/config.yaml" 2>&1 | tail -n 1)"
    [[ $claim_said == "partition mmpo: nodes have gpu:$GPUS; claiming $GPUS a node for ray.sub, the recipe uses $RECIPE_GPUS" &&
        $tres == *"gpu:$GPUS" && $recipe_gpus == "$RECIPE_GPUS" ]] &&
        grep -q "GRES support detected. Using: --gres=gpu:$GPUS" "$WORK/jobs/slurm-$job.out"
    report "gpu:$GPUS node, $RECIPE_GPUS-GPU recipe" $? \
        "said: ${claim_said:-nothing}; job TresPerNode=$tres; ray.sub: $(grep -m1 'GRES' "$WORK/jobs/slurm-$job.out"); recipe's cluster.gpus_per_node: $recipe_gpus" \
        "$claim_said; job TresPerNode=$tres; cluster.gpus_per_node=$recipe_gpus"
    # ray.sub started the head (its signal file, Ray's banner) and the driver joined that cluster
    grep -q "Ray runtime started" "$logs/ray-head.log" 2>/dev/null && [[ -f "$logs/STARTED_RAY_HEAD" ]]
    report "ray.sub started Ray" $? "see $logs/ray-head.log"
    grep -q "Connecting to existing Ray cluster" "$WORK/runs/train/logs/nemo_rl.log" 2>/dev/null
    report "driver joined ray.sub's cluster" $? "see $WORK/runs/train/logs/nemo_rl.log"
    grep -q "^advantage: nemo-mmpo mmpo" "$driver_log" 2>/dev/null
    report "entry point's check ran in the job" $? "no plan in $driver_log"
    unread="$(grep -c "transform_alpha=0.5 is not read" "$driver_log" 2>/dev/null)"
    [[ "$unread" -eq 1 ]]
    report "unread setting named once in the run's log" $? "named ${unread:-0} times in $driver_log"
    steps="$(grep -c '^step  *[0-9]*/3 ' "$driver_log" 2>/dev/null)"
    weights="$WORK/runs/train/checkpoints/step_3/policy/weights"
    [[ "$steps" -eq 3 && -d "$weights" ]]
    report "3 GRPO steps and a checkpoint" $? "steps logged: ${steps:-0}, $weights $([[ -d $weights ]] && echo present || echo missing)" "$weights"
fi

# scancel mid-run: the job ends CANCELLED and no Ray process is left behind.
namespace_processes() {  # "pid:name" of each process in slurmd's namespace but its init, slurmd
    local init pid namespace name
    init="$(pgrep -P "$(cat "$WORK/run/slurmd-namespace.pid")" | head -n 1)"
    namespace="$(readlink "/proc/$init/ns/pid")"
    for pid in /proc/[0-9]*; do
        pid="${pid#/proc/}"
        [[ $pid != "$init" && "$(readlink "/proc/$pid/ns/pid" 2>/dev/null)" == "$namespace" ]] || continue
        name="$(cat "/proc/$pid/comm" 2>/dev/null)"
        [[ -n "$name" && $name != slurmd ]] && echo "$pid:$name"
    done
}
no_job_processes() { [[ -z "$(namespace_processes)" ]]; }
submit cancel grpo.max_num_steps=200
job="$(submitted_id cancel)"
if [[ -z "$job" ]]; then
    report "scancel mid-run" 1 "not submitted: $(tail -n 5 "$WORK/log/submit-cancel.log")"
else
    driver_log="$WORK/jobs/$job-logs/ray-driver.log"
    in_training() { grep -q '^step  *[0-9]*/200 ' "$driver_log" 2>/dev/null || job_ended "$job"; }
    wait_until 150 in_training
    running="$(grep -c '^step  *[0-9]*/200 ' "$driver_log" 2>/dev/null) steps done"
    ray_before="$(namespace_processes | grep -c -E ':(raylet|gcs_server)$')"
    scancel "$job"
    wait_until 60 job_ended "$job"
    state="$(job_state "$job")"
    wait_until 30 no_job_processes
    left="$(namespace_processes | tr '\n' ';')"
    [[ $state == CANCELLED && $ray_before -ge 2 && -z "$left" ]]
    report "scancel mid-run" $? "job $job at $running, $ray_before Ray daemons; then $state, left behind: ${left:-nothing}" \
        "job $job cancelled at $running; nothing left behind"
fi

echo "slurm one host: $failures failed, $((SECONDS - started)) s"
part_line "the Slurm suite, one host" "$((SECONDS - started))" \
    "$([[ $failures == 0 ]] && echo ok || echo "FAILED: $failures check(s)")" "$(part_cpu_seconds slurm)"
two_hosts_started=$SECONDS
trap - EXIT
teardown  # this cluster gone before the next starts

# ------------------------------------------------------------------ two hosts --------------
# scripts/test_slurm_two_hosts.sh: slurm/mmpo_multinode.sh across two slurmd hosts in network
# namespaces, a lost node2, the resubmission. ray.sub differs between the snapshots (ports, Ray's
# GCS and health-check settings): each runs the whole sequence, v0.7.0 losing node2's network,
# main its slurmd (NEMO_RL_PATH: that checkout, both faults).
# Each sequence is two jobs of Ray, NeMo-RL and the tiny recipe (~280 CPU-seconds, ~245 s alone
# on 2 cores); CI runs one of them a commit, as it trains the long end-to-end runs in turns
# (tests/long_runs.py): the v0.7.0 one on even commit counts, main's on odd ones, so both run
# in CI within two commits. NEMO_MMPO_SLURM_TWO_HOSTS=all|v0.7.0|main chooses (default: all
# outside CI).
if [[ -n "${NEMO_RL_PATH:-}" ]]; then
    two_hosts=("$nemo_rl:network" "$nemo_rl:slurmd")
    two_hosts_choice=all
else
    two_hosts=()
    if [[ $two_hosts_choice == all || $two_hosts_choice == v0.7.0 ]]; then
        two_hosts+=("$nemo_rl:network")
    fi
    main_ref="$(nemo_rl_snapshot_refs | grep '^main' | head -n 1)"
    if [[ -n "$main_ref" && ( $two_hosts_choice == all || $two_hosts_choice == main ) ]]; then
        two_hosts+=("$(nemo_rl_unpack "$main_ref"):slurmd")
    fi
fi
echo "slurm two hosts: NEMO_MMPO_SLURM_TWO_HOSTS=$two_hosts_choice (${#two_hosts[@]} sequence(s))"
two_hosts_code=0
if [[ ${#two_hosts[@]} == 0 ]]; then
    echo "slurm two hosts: no NeMo-RL main snapshot in $NEMO_RL_SNAPSHOTS for NEMO_MMPO_SLURM_TWO_HOSTS=main"
    two_hosts_code=1
else
    (part_cpu_begin slurm/two_hosts && exec bash scripts/test_slurm_two_hosts.sh "$VENV" "${two_hosts[@]}") ||
        two_hosts_code=$?
fi
[[ $two_hosts_code == 0 ]] || failures=$((failures + 1))
part_line "the Slurm suite, two hosts ($two_hosts_choice)" "$((SECONDS - two_hosts_started))" \
    "$([[ $two_hosts_code == 0 ]] && echo ok || echo FAILED)" "$(part_cpu_seconds slurm/two_hosts)"
echo "slurm suite: $failures failed, $((SECONDS - started)) s"
leave_cpu_group
[[ $failures -eq 0 ]]
