"""The CPU rig: the tiny addition task and model, the warm start, the measures of success and
the driver that runs a tiny recipe through NeMo-RL's trainers on the engines. Imports
:mod:`nemo_mmpo.cpu.engines` and :mod:`nemo_mmpo.cpu.answers`."""
