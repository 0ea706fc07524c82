"""The engines the CPU rig runs: NeMo-RL's own Megatron policy and vLLM generation started
with the CPU answers, the transformers policy and sampler, the Ray session. Imports
:mod:`nemo_mmpo.cpu.answers` only."""
