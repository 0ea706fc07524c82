#!/bin/bash
# Build .gpu/ (ignored; add `/.gpu/` to .git/info/exclude), what benchmarks/gpu_check.sh needs
# beyond the GPU machine's image (Python 3.12, torch 2.11 + CUDA 13, transformers 5.17,
# no internet, no Ray): Python 3.12 x86-64 wheels, each --no-deps, and NeMo-RL v0.7.0's source.
# The list is NeMo-RL v0.7.0's import-time needs that the image lacks, found by importing the
# check's modules with only the image's packages plus these visible. Not carried: ray (~70 MiB;
# gpu_standins.py answers its import) and wandb (~27 MiB; likewise, in NeMo-RL's logger only).
# transformers 5.8.1 and tokenizers 0.22.2 replace the image's 5.17/0.23.2: NeMo-RL v0.7.0's
# nemo_rl/models/policy/__init__.py:52 asserts transformers < 5.12. About 52 MiB in all.
# Usage: bash benchmarks/gpu_carry.sh [NEMO_RL_TARBALL]   (needs PyPI)
set -euo pipefail
cd "$(dirname "$0")/.."
tarball=${1:-../shared/nemo-rl/nemo-rl-v0.7.0.tar.gz}
WHEELS=(
    megatron-core==0.19.2 megatron-bridge==0.6.2 nvidia-modelopt==0.46.0 pulp==3.3.1
    megatron-energon==7.4.1 multi-storage-client==1.3.1 opentelemetry-api==1.45.2
    opentelemetry-semantic-conventions==0.66b2 braceexpand==0.1.7 filetype==1.2.0
    rapidyaml==0.15.2 webdataset==1.0.2 lark==1.3.1 wcmatch==10.2.1 bracex==3.2.3
    xattr==1.3.0 cffi==2.1.1 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
    referencing==0.37.0 rpds-py==2026.9.1 pydantic==2.13.4 pydantic-core==2.46.4
    annotated-types==0.7.0 typing-inspection==0.4.2 omegaconf==2.3.0 hydra-core==1.3.2
    transformers==5.8.1 tokenizers==0.22.2 datasets==4.8.5 multiprocess==0.70.19 dill==0.4.1
    pyzmq==27.1.0 fastapi==0.136.1 starlette==1.10.0 uvicorn==0.46.0 tensordict==0.12.4
    pyvers==0.2.3 deprecation==2.1.0
)
mkdir -p .gpu/whl
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .gpu/whl "${WHEELS[@]}"
# antlr4-python3-runtime 4.9.3 (hydra-core 1.3's pin) is published as source only: build it.
python3 -m pip wheel -q --no-deps -w .gpu/whl antlr4-python3-runtime==4.9.3
cp "$tarball" .gpu/nemo-rl-v0.7.0.tar.gz
du -sh .gpu
