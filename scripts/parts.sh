# Shared by scripts/test.sh and the suites it runs (source it): each part's seconds and outcome,
# gathered for the table that ends CI's log, and Ray's start-up limits on the test machine.
# NEMO_MMPO_PARTS (exported by scripts/test.sh) names the file the parts are added to; without
# it part_line does nothing.

#: Ray's start-up limits on this test machine, which shares 2 cores among CI's parts (a setting
#: of the machine, given to every Ray cluster the suites start, never of nemo-mmpo's launcher):
#: Ray's dashboard gives each of its modules 30 s to start ("Module MetricsHead failed to
#: start. Timeout after 30.0 seconds" on a loaded machine; NeMo-RL's init_ray() and ray.sub
#: start the dashboard), the dashboard process 60 s to come up at all (`ray start` fails; a
#: two-host Slurm job's head failed so on its second and third tries in the fresh-clone CI of
#: 189a6d2, the first on the raylet's fixed 30 s), and a worker process 60 s to register with
#: its raylet. (Not RAY_raylet_start_wait_time_s, given here in 194ce34 and taken back: a node
#: whose `ray start` never registers has a dead raylet: Ray 2.55's raylet aborts when its
#: dashboard agent has not written its port within a fixed 15 s ("Check failed ... Timed out
#: waiting for file .../dashboard_agent_listen_port_..."), and a longer wait only delays
#: ray.sub's next try; the Slurm suite's jobs get the CPU instead: scripts/slurm_test_lib.sh,
#: enter_cpu_group)
NEMO_MMPO_RAY_PATIENCE="RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT=300 RAY_DASHBOARD_STARTUP_TIMEOUT_S=300 RAY_worker_register_timeout_seconds=600"
#: Ray's telemetry at a slower pace, on the same test machine: with no dashboard to read them,
#: every Ray process still exports metrics and task events each second or few, the dashboard
#: agent samples every process every 5 s, and two idle workers start with each driver: a local
#: cluster with two actors, started and left idle for a minute, spent 7.8-8.1 CPU-seconds, 7.2
#: with these (2026-11-29, the 2-core Intel machine, beside a CI): a small saving, but CI's
#: clusters are up for most of its ~20 minutes. Not the autoscaler's 5 s: `ray status`, which
#: ray.sub and the two-host checks read, reports from it.
NEMO_MMPO_RAY_QUIET="RAY_enable_metrics_collection=0 RAY_metrics_report_interval_ms=60000 RAY_task_events_report_interval_ms=10000 REPORTER_UPDATE_INTERVAL_MS=60000 RAY_prestart_worker_first_driver=0"
#: What every NeMo-RL session of our tests and every Slurm job of the suites gets, as NAME=VALUE
#: words for env(1) (settings of the test machine; a user's cluster keeps its own): Ray's
#: start-up limits and quiet telemetry (above);
#: - no Hugging Face hub: this machine reaches none, and every model the suites load is a local
#:   folder; without HF_HUB_OFFLINE=1 each vLLM engine spent ~22 s of its start asking the hub
#:   about that folder (vLLM 0.25.1's create_engine_config: 22.9 s, 1.1 s with it, measured
#:   2026-11-28 on the 2-core machine);
#: - no torch.compile: vLLM's CPU sampler (`compiled_random_sample`) and megatron-core's fused
#:   activations (`jit_fuser`) call it, and on a CPU that is Dynamo, Inductor and g++ compiling
#:   C++ kernels (and a 123 MB precompiled header of torch's) in each engine and worker
#:   process: work the GPU path these runs stand in for never does (it compiles Triton
#:   kernels); eager, it is the same math. Measured on the 2-core Intel machine, 2026-11-29,
#:   Inductor's cache already warm: vLLM's refit test on main 82 -> 61 CPU-seconds, the
#:   Megatron recipe's 50 steps and the watcher 566 -> 495 (with the quiet Ray, and the
#:   autoscaler's interval at 60 s, left out here since).
#: NeMo-RL's unit tests get the Ray limits only: they keep the environment their outcomes were
#: recorded in (scripts/test_nemo_rl.sh says more). (Ray's workers keep Ray's nice 15: at nice
#: 0, tried in the fresh-clone CI of ae85847, NeMo-RL's own unit tests, run beside a session's
#: tail, missed their 60 s for two spawned gloo processes; docs/testing.md, "CI")
NEMO_MMPO_TEST_MACHINE="$NEMO_MMPO_RAY_PATIENCE $NEMO_MMPO_RAY_QUIET TORCH_COMPILE_DISABLE=1 HF_HUB_OFFLINE=1"

part_line() {  # part_line NAME SECONDS OUTCOME [CPU_SECONDS]: one part, e.g. "the Slurm suite,
    # one host" 412 ok 380
    [[ -n "${NEMO_MMPO_PARTS:-}" ]] || return 0
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:--}" >>"$NEMO_MMPO_PARTS"
}

parts_table() {  # parts_table FILE TOTAL_SECONDS OUTCOME [CPU_SECONDS]: the table of FILE's
    # parts, then the whole run
    local name seconds outcome cpu
    printf '\n%-58s %8s %8s  %s\n' "part" "seconds" "CPU-s" "outcome"
    printf '%-58s %8s %8s  %s\n' "----" "-------" "-----" "-------"
    if [[ -s "$1" ]]; then
        while IFS=$'\t' read -r name seconds outcome cpu; do
            printf '%-58s %8s %8s  %s\n' "$name" "$seconds" "${cpu:--}" "$outcome"
        done <"$1"
    fi
    printf '%-58s %8s %8s  %s\n' "the whole run (wall clock)" "$2" "${4:--}" "$3"
}

# Each part's CPU-seconds: the CPU time of every process it starts, Ray's daemons and workers
# included (a parent's rusage misses what it does not wait for), from a cpuacct cgroup per part
# under NEMO_MMPO_CPU_GROUPS (made by scripts/test.sh where this machine lets it: root, cgroup
# v1's cpuacct; else unset, and the column says "-"). On 2 cores CI's wall time is at best the
# CPU its parts spend, halved (docs/testing.md, "What CI costs"): the column says which parts.
# A group only counts; where cpu and cpuacct share one hierarchy its processes are also
# scheduled as one group, as this kernel's autogroups already group each session.
part_cpu_begin() {  # part_cpu_begin KEY: this shell, and what it starts from now on, counted
    # under KEY (nested keys a/b: a counts b's too)
    [[ -n "${NEMO_MMPO_CPU_GROUPS:-}" ]] || return 0
    { mkdir -p "$NEMO_MMPO_CPU_GROUPS/$1" && echo "$BASHPID" >"$NEMO_MMPO_CPU_GROUPS/$1/cgroup.procs"; } 2>/dev/null ||
        true  # (not counted: the column says -)
}
part_cpu_seconds() {  # part_cpu_seconds KEY: the CPU-seconds counted under KEY so far, or -
    # (also under set -e where nothing is counted: a background session's shell went on to
    # write its exit status only where CI's groups existed; run alone, both sessions read as failed)
    local usage=""
    usage="$(cat "${NEMO_MMPO_CPU_GROUPS:-/nonexistent}/$1/cpuacct.usage" 2>/dev/null)" || true
    if [[ $usage =~ ^[0-9]+$ ]]; then echo $((usage / 1000000000)); else echo -; fi
}
