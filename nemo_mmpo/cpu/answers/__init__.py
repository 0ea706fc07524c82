"""The engines' CPU answers: each answers one named upstream line (NeMo-RL, megatron-core,
Megatron-Bridge, vLLM) that assumes CUDA, applied only by the CPU rig and the tests, never on a
GPU node. The lowest room of :mod:`nemo_mmpo.cpu`: it imports no other room."""
