#!/bin/bash
# The GPU check (issue 38, item 7): on one H100/H200 with Python 3.12, torch 2.11 + CUDA 13
# and no internet, in at most ~7 minutes:
#   (a) the CUDA tests that exist (pytest -k cuda: tests/test_estimators.py::test_cuda_matches_cpu,
#       tests/test_dmpo.py::test_cuda_batch_terms_and_penalty_term_match_cpu, and
#       tests/test_cpu_answers_on_gpu.py: every CPU answer refuses a process that sees CUDA);
#   (b) benchmarks/gpu_bench.py: our estimators, DMPO's batch terms and the mmpo and dmpo losses
#       against NeMo-RL's GRPO estimator and ClippedPGLossFn on the GPU, as ratios to those
#       measured in the same run;
#   (c) benchmarks/gpu_worker_step.py: NeMo-RL's MegatronPolicyWorker (no Ray), the tiny
#       model imported through Megatron-Bridge, log-probs and bf16 train steps with mmpo and
#       with clipped_pg.
# What it needs beyond the machine's image travels in the ignored folder .gpu/ (build it here
# with `bash benchmarks/gpu_carry.sh`): .gpu/whl/*.whl and NeMo-RL v0.7.0's source tarball.
# Usage, from the repository root on the GPU machine:
#   OUT=/some/folder bash benchmarks/gpu_check.sh
# Writes $OUT/gpu_check.log, $OUT/gpu_bench.json, $OUT/gpu_worker_step.json, $OUT/gpu_tests.txt
# and exits non-zero if any part failed (each part runs even if an earlier one failed).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/results/gpu_check}
PYTHON=${PYTHON:-python3}
CARRIED=${GPU_CARRIED:-.gpu}
SITE=${GPU_SITE:-/tmp/gpu-check-site}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 TORCHDYNAMO_DISABLE=1 HF_HUB_OFFLINE=1
stage() { echo "=== $(date -u '+%Y-%m-%d %H:%M:%S') UTC: $*"; }
failed=()

stage "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PYTHON" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())' ||
    { echo "no CUDA device through $PYTHON's torch"; exit 1; }
git log -1 --format='commit %H %cd' 2>/dev/null || true

stage "install: $(ls "$CARRIED"/whl/*.whl | wc -l) carried wheels into $SITE (--no-deps), NeMo-RL v0.7.0 source"
rm -rf "$SITE"
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
    "$CARRIED"/whl/*.whl || { echo "installing the carried wheels failed"; exit 1; }
mkdir -p .nemo-rl
[ -d .nemo-rl/nemo-rl-v0.7.0/nemo_rl ] || tar -xzf "$CARRIED/nemo-rl-v0.7.0.tar.gz" -C .nemo-rl ||
    { echo "unpacking NeMo-RL failed"; exit 1; }
export NEMO_RL_PATH=$PWD/.nemo-rl/nemo-rl-v0.7.0
export PYTHONPATH=$SITE:$NEMO_RL_PATH:$PWD
"$PYTHON" -m pip list 2>/dev/null | grep -i -E '^(torch|transformers|tokenizers|megatron-core|megatron-bridge|pydantic) ' || true

stage "(a) CUDA tests"
timeout 180 "$PYTHON" -m pytest -q -p no:cacheprovider -rA -k cuda tests/test_estimators.py tests/test_dmpo.py \
    tests/test_cpu_answers_on_gpu.py \
    2>&1 | tee "$OUT/gpu_tests.txt"
status=$?
# it must have run (not skipped): a machine whose torch sees no GPU fails this part
grep -q -E "[0-9]+ passed" "$OUT/gpu_tests.txt" &&
    ! grep -q -E "[0-9]+ (failed|skipped|errors?)" "$OUT/gpu_tests.txt" || status=1
[ $status -eq 0 ] || failed+=("cuda-tests")

stage "(b) estimator, DMPO terms and loss timings against NeMo-RL's"
timeout 150 "$PYTHON" benchmarks/gpu_bench.py --device cuda --out "$OUT/gpu_bench.json" ||
    failed+=("timings")

stage "(c) MegatronPolicyWorker: log-probs and bf16 train steps, mmpo and clipped_pg"
timeout 240 "$PYTHON" benchmarks/gpu_worker_step.py --work /tmp/gpu-worker-step \
    --out "$OUT/gpu_worker_step.json" || failed+=("worker-step")

stage "done; failed parts: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
