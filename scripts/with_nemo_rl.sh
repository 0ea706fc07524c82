#!/usr/bin/env bash
# Run a command in NeMo-RL's CPU environment: Python 3.13 with NeMo-RL's pure-Python
# dependencies (.venv-nemo-rl, built if missing, reused when `bash scripts/test.sh` built it)
# and vLLM's CPU build at the version that NeMo-RL pins (an overlay, .venv-nemo-rl-vllm-<v>),
# NeMo-RL on PYTHONPATH, and that environment's `python` first on PATH. The command runs in the
# directory you run this from (a run's relative paths start there).
#   bash scripts/with_nemo_rl.sh python -m nemo_mmpo.study run --out results/study
# Gets what is missing, and says where it went:
#   NeMo-RL: NEMO_RL_PATH, else the v0.7.0 snapshot beside this clone (../shared/nemo-rl,
#     unpacked into .nemo-rl/), else NeMo-RL's git tag v0.7.0 cloned with its submodules into
#     .nemo-rl/RL-v0.7.0 (once);
#   Python 3.13: NEMO_RL_PYTHON, python3.13 on PATH or pyenv's, else uv's (`uv python install`).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/nemo_rl_env.sh
source "$ROOT/scripts/nemo_rl_env.sh"
NEMO_RL_TAG="v0.7.0"

if [[ $# -eq 0 ]]; then
    echo "usage: bash scripts/with_nemo_rl.sh COMMAND [ARGUMENTS]" >&2
    exit 2
fi
if [[ -n "${NEMO_RL_PATH:-}" ]]; then
    [[ -d "$NEMO_RL_PATH/nemo_rl" ]] || { echo "NEMO_RL_PATH=$NEMO_RL_PATH has no nemo_rl/ folder" >&2; exit 2; }
    nemo_rl="$(cd "$NEMO_RL_PATH" && pwd)"
elif nemo_rl_snapshot_refs | grep -qx "$NEMO_RL_TAG"; then
    nemo_rl="$(nemo_rl_unpack "$NEMO_RL_TAG")"
    echo "with_nemo_rl: NeMo-RL $NEMO_RL_TAG from the snapshot in $NEMO_RL_SNAPSHOTS, unpacked in $nemo_rl" >&2
else
    nemo_rl="$NEMO_RL_UNPACKED/RL-$NEMO_RL_TAG"
    if [[ ! -d "$nemo_rl/nemo_rl" ]]; then
        echo "with_nemo_rl: cloning NeMo-RL $NEMO_RL_TAG with its submodules into $nemo_rl (once)" >&2
        mkdir -p "$NEMO_RL_UNPACKED"
        git clone --quiet --recursive --depth 1 --shallow-submodules --branch "$NEMO_RL_TAG" \
            https://github.com/NVIDIA-NeMo/RL.git "$nemo_rl" >&2 ||
            { echo "with_nemo_rl: could not clone NeMo-RL; set NEMO_RL_PATH to a checkout of $NEMO_RL_TAG" >&2; exit 2; }
    fi
    echo "with_nemo_rl: NeMo-RL $NEMO_RL_TAG from $nemo_rl" >&2
fi
python="$(nemo_rl_python)"
if [[ -z "$python" ]]; then
    if command -v uv >/dev/null; then
        echo "with_nemo_rl: no Python 3.13 found; installing uv's (uv python install 3.13)" >&2
        uv python install 3.13 >&2
        python="$(uv python find 3.13)"
        echo "with_nemo_rl: Python 3.13 at $python" >&2
    else
        echo "needs Python 3.13 (NeMo-RL's): install uv (https://docs.astral.sh/uv/) and run this again, or set NEMO_RL_PYTHON" >&2
        exit 2
    fi
fi
export NEMO_RL_PYTHON="$python"
nemo_rl_environment "$python" >&2
# with vLLM's CPU build at the version this NeMo-RL pins (a thin overlay; none for a NeMo-RL
# whose vLLM has no CPU build here: then the recipes with cpu_backend.engine=vllm cannot run)
environment="$NEMO_RL_VENV"
vllm_version="$(nemo_rl_vllm_version "$nemo_rl")"
if [[ -n "$vllm_version" && -f "$ROOT/scripts/vllm_cpu_requirements-$vllm_version.txt" ]]; then
    environment="$(nemo_rl_vllm_environment "$vllm_version")"
fi
# a snapshot's pinned engines where their source is at hand (main: megatron-core from
# Megatron-LM 14346b65, Megatron-Bridge 8c46dc42) ahead of the environment's releases
snapshot="$(basename "$nemo_rl")"
engines="$(nemo_rl_engine_path "${snapshot#nemo-rl-}")"
export NEMO_RL_PATH="$nemo_rl"
export PYTHONPATH="${engines:+$engines:}$nemo_rl:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export NEMO_RL_PY_EXECUTABLES_SYSTEM=1
# the overlay first (its python), then the base environment (the console scripts: ray, ...)
export PATH="$environment/bin:$NEMO_RL_VENV/bin:$PATH"
exec "$@"
