# Helpers shared by scripts/test_slurm.sh (one host) and scripts/test_slurm_two_hosts.sh, sourced
# by them. They read IN_CI, WORK (the suite's state directory) and VENV, and count `failures`.

# shellcheck source=scripts/parts.sh
source "$(dirname "${BASH_SOURCE[0]}")/parts.sh"

skip_or_fail() {  # a missing prerequisite: a failure in CI, a message elsewhere
    if [[ "$IN_CI" == "true" ]]; then
        echo "slurm prerequisites: FAILED $1"
        part_line "the Slurm suite" "$SECONDS" "FAILED: $1"
        exit 1
    fi
    echo "slurm suite: skipped: $1"
    part_line "the Slurm suite" "$SECONDS" "skipped: $1"
    exit 0
}

report() {  # report CHECK STATUS FAILURE-DETAIL [OK-DETAIL]: one line; STATUS != 0 fails
    if [[ "$2" -eq 0 ]]; then
        echo "slurm $1: ok${4:+ ($4)}"
    else
        echo "slurm $1: FAILED $3"
        failures=$((failures + 1))
    fi
}

wait_until() {  # wait_until SECONDS COMMAND...: poll COMMAND every second; fails on timeout
    local limit=$1
    shift
    local deadline=$((SECONDS + limit))
    until "$@"; do
        ((SECONDS < deadline)) || return 1
        sleep 1
    done
}

stop_recorded() {  # stop_recorded NAME...: stop the processes whose PIDs are in $WORK/run/NAME.pid
    local name pid
    for name in "$@"; do
        [[ -f "$WORK/run/$name.pid" ]] || continue
        pid="$(cat "$WORK/run/$name.pid")"
        # only a process of ours: its command line names our config or socket
        if [[ -n "$pid" ]] && grep -qa "$WORK" "/proc/$pid/cmdline" 2>/dev/null; then
            # a namespace: SIGKILL (unshare ignores SIGTERM; its child, the namespace's first
            # process, then dies, and with it every process in the namespace)
            [[ $name == *namespace* ]] && kill -9 "$pid" 2>/dev/null
            kill "$pid" 2>/dev/null
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
            kill -9 "$pid" 2>/dev/null
        fi
        rm -f "$WORK/run/$name.pid"
    done
}

# The Slurm suite's CPU group. Every Ray node a job starts runs Ray 2.55's raylet, which starts
# three Python helpers (the dashboard agent, the runtime-env agent, the log monitor) and aborts
# when the dashboard agent has not written its port within a fixed 15 s, which no setting
# changes ("Check failed ... Timed out waiting for file .../dashboard_agent_listen_port_...").
# The agent needs ~1.5 CPU-seconds; in CI its node shares 2 cores with both NeMo-RL sessions
# and the 3.11 suite, and this machine's kernel shares CPU between sessions (autogroups: each
# `setsid`, each Slurm job step, is one; a process's nice counts only inside its own), so a
# starting node got less than that: node2 of the two-host sequence never joined (each of
# ray.sub's tries aborted so) in the fresh-clone CIs of 57ccf22, 33a516c and 90cbd2d's landing,
# while alone, or beside busy loops in one session, it joined at once. So the suite, and with
# it its daemons and every process of its jobs, runs in a CPU cgroup of its own weighted
# CPU_GROUP_WEIGHT times a session (SLURM_TEST_CPU_WEIGHT, default 4; 0: no group). While its
# jobs compute, the rest of CI waits for them (the CPU they spend is the same). A setting of
# this test machine, not of the launcher; where the cgroup cannot be made (no writable CPU
# controller), the suite says so and runs as before.
CPU_GROUP_WEIGHT="${SLURM_TEST_CPU_WEIGHT:-4}"
CPU_GROUP_NAME=nemo-mmpo-slurm
cpu_group=""  # the group this shell entered (leave_cpu_group leaves it)
enter_cpu_group() {  # this shell (and what it starts from now on) into the suite's CPU group, said
    # in one line; nothing if it is there already (the two-host mode run by scripts/test_slurm.sh)
    local v1=/sys/fs/cgroup/cpu v2=/sys/fs/cgroup group="" why=""
    grep -q "/$CPU_GROUP_NAME\$" "/proc/$$/cgroup" 2>/dev/null && return 0
    if ! [[ $CPU_GROUP_WEIGHT =~ ^[0-9]+$ ]]; then
        echo "slurm CPU group: SLURM_TEST_CPU_WEIGHT=$CPU_GROUP_WEIGHT is not a whole number: unset it (4) or give one (0: no group)"
        exit 2
    elif [[ $CPU_GROUP_WEIGHT == 0 ]]; then
        why="SLURM_TEST_CPU_WEIGHT=0"
    elif [[ -f $v1/cpu.shares ]]; then
        group="$v1/$CPU_GROUP_NAME"
        { mkdir -p "$group" && echo $((1024 * CPU_GROUP_WEIGHT)) >"$group/cpu.shares" &&
            echo $$ >"$group/cgroup.procs"; } 2>/dev/null || why="cgroup v1 $group not writable"
    elif [[ -f $v2/cgroup.controllers ]] && grep -qw cpu "$v2/cgroup.controllers"; then
        group="$v2/$CPU_GROUP_NAME"
        { grep -qw cpu "$v2/cgroup.subtree_control" || echo +cpu >"$v2/cgroup.subtree_control"; } 2>/dev/null
        { mkdir -p "$group" && echo $((100 * CPU_GROUP_WEIGHT)) >"$group/cpu.weight" &&
            echo $$ >"$group/cgroup.procs"; } 2>/dev/null || why="cgroup v2 $group not writable"
    else
        why="no CPU controller under /sys/fs/cgroup"
    fi
    if [[ -z $why ]]; then
        cpu_group="$group"
        local shared=""
        [[ -z ${NEMO_MMPO_CPU_GROUPS:-} || $group != "$v1/"* ||
            "$(realpath "$v1")" != "$(realpath /sys/fs/cgroup/cpuacct 2>/dev/null)" ]] ||
            shared="; cpu and cpuacct share one hierarchy here, so CI's table does not count it"
        echo "slurm CPU group: ok ($group, $CPU_GROUP_WEIGHT times a session's weight$shared)"
    else
        echo "slurm CPU group: none ($why): the jobs share the CPU as any process does"
    fi
}
leave_cpu_group() {  # this shell back in the root group and the group removed, if this shell
    # entered it (a group left by a killed run is empty, and the next run reuses it)
    [[ -n $cpu_group ]] || return 0
    echo $$ >"$(dirname "$cpu_group")/cgroup.procs" 2>/dev/null
    rmdir "$cpu_group" 2>/dev/null
    cpu_group=""
    return 0
}

job_env_for() {  # job_env_for NEMO_RL: the jobs' JOB_ENV (slurm/submit_mmpo.sh) without a container
    # NeMo-RL's Python environment, its ray on PATH; ray.sub's logs and signal files under $WORK
    # (default: the repo). Ray's start-up limits raised and no hub ($NEMO_MMPO_TEST_MACHINE, from
    # scripts/parts.sh): ray.sub starts the head with the dashboard
    # (--include-dashboard=True) and gives up after three tries, and in CI these jobs share 2
    # cores with the NeMo-RL suite's two sessions (a resumed job's head failed so in the
    # fresh-clone CI of 4801bde: "MetricsHead ... Timeout after 30.0 seconds"). A setting of
    # this test machine, not of the launcher.
    echo "PATH=$VENV/bin:$PATH PYTHONPATH=$1 NEMO_RL_PY_EXECUTABLES_SYSTEM=1 OMP_NUM_THREADS=1" \
        "BASE_LOG_DIR=$WORK/jobs $NEMO_MMPO_TEST_MACHINE"
}

copy_checkout() {  # copy_checkout: the working tree (tracked and untracked, not ignored) under
    # /tmp, as a checkout made by `mktemp -d` would be; sets checkout_copy
    checkout_copy="$(mktemp -d /tmp/nemo-mmpo-slurm-checkout.XXXXXX)/nemo-mmpo"
    mkdir -p "$checkout_copy"
    git ls-files -z --cached --others --exclude-standard \
        | tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$checkout_copy"
    if [[ ! -f "$checkout_copy/slurm/submit_mmpo.sh" ]]; then
        report "checkout copy under /tmp" 1 "git ls-files | tar into $checkout_copy copied no slurm/submit_mmpo.sh"
        exit 1
    fi
}

build_gres_and_spank() {  # build_gres_and_spank GPUS: device files, the pyxis stand-in
    # gres/gpu needs device files (slurmd drops file-less GPUs and drains the node)
    for index in $(seq 0 $(($1 - 1))); do ln -s /dev/null "$WORK/dev/nvidia$index"; done
    # built with this machine's compiler against libslurm-dev's spank.h
    if ! cc -Wall -Wextra -Werror -shared -fPIC -o "$WORK/etc/pyxis_standin.so" \
            slurm/test/pyxis_standin.c 2>"$WORK/log/cc.log"; then
        report "spank build" 1 "$(tail -n 5 "$WORK/log/cc.log")"
        exit 1
    fi
    echo "required $WORK/etc/pyxis_standin.so" > "$WORK/etc/plugstack.conf"
}

slurm_conf_common() {  # the settings both suites' slurm.conf share
    cat <<CONF
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$WORK/munge/munge.socket
StateSaveLocation=$WORK/spool/ctld
SlurmctldPidFile=$WORK/log/slurmctld.pid
SlurmctldLogFile=$WORK/log/slurmctld.log
# pgid: a cancelled or finished job's processes (Ray's daemons included) are killed with it;
# linuxproc lets Ray's daemons escape and the job never ends
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
PlugStackConfig=$WORK/etc/plugstack.conf
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$WORK/log/jobcomp.txt
ReturnToService=2
MinJobAge=3600
KillWait=10
CONF
}

start_munged() {  # munged with its own key and socket, as the munge user (it refuses root)
    chown munge:munge "$WORK/munge" && chmod 755 "$WORK/munge"  # clients reach the socket
    mungekey --create --keyfile="$WORK/munge/munge.key" 2>>"$WORK/log/munged.log"
    chown munge:munge "$WORK/munge/munge.key"
    setpriv --reuid=munge --regid=munge --init-groups munged --foreground \
        --socket="$WORK/munge/munge.socket" --key-file="$WORK/munge/munge.key" \
        --pid-file="$WORK/munge/munged.pid" --seed-file="$WORK/munge/munged.seed" \
        --log-file="$WORK/munge/munged.log" >>"$WORK/log/munged.log" 2>&1 &
    echo $! > "$WORK/run/munged.pid"
    disown  # stopped by PID in teardown; no job-control notice then
}

paths_under_tmp() {  # paths_under_tmp PATH...: those of PATH... that lie under /tmp (resolved)
    local path
    for path in "$@"; do
        path="$(realpath "$path")"
        [[ $path == /tmp/* ]] && echo "$path"
    done
}

# The body of a node's namespace (bash -c): its /tmp and /dev/shm private, the paths under /tmp
# the jobs need bound back (the host's /tmp is first bound to $host_tmp, outside /tmp, then
# each path from there, then $host_tmp let go), HOSTS (if not empty) on /etc/hosts and HOSTNAME
# (if not empty) set; then slurmd. bash stays the namespace's first process, reaping what jobs
# orphan.
# Arguments: NODE CONF HOST_TMP HOSTS HOSTNAME PATH...
# shellcheck disable=SC2016 # expanded by the namespace's bash
NODE_NAMESPACE_BODY='
    node="$1" conf="$2" host_tmp="$3" hosts="$4" name="$5"
    shift 5
    mount --bind /tmp "$host_tmp" || exit 1
    mount -t tmpfs -o mode=1777 tmpfs /tmp && mount -t tmpfs -o mode=1777 tmpfs /dev/shm || exit 1
    for path in "$@"; do
        mkdir -p "$path" && mount --bind "$host_tmp/${path#/tmp/}" "$path" || exit 1
    done
    umount -l "$host_tmp"
    if [[ -n "$hosts" ]]; then mount --bind "$hosts" /etc/hosts || exit 1; fi
    if [[ -n "$name" ]]; then hostname "$name" || exit 1; fi
    slurmd -D -N "$node" -f "$conf" &
    wait'

job_ids() { scontrol show jobs -o 2>/dev/null | grep -o '^JobId=[0-9]*' | cut -d= -f2 | sort -n; }
job_field() { scontrol show job "$1" -o 2>/dev/null | grep -o "$2=[^ ]*" | cut -d= -f2; }
job_state() { job_field "$1" JobState; }
job_ended() {
    case "$(job_state "$1")" in
        COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED) return 0 ;;
        *) return 1 ;;
    esac
}
submitted_id() { grep -o 'Submitted batch job [0-9]*' "$WORK/log/submit-$1.log" | grep -o '[0-9]*$'; }
