"""The launcher: from a recipe and overrides to a checked plan and a run.

- :mod:`.loader`: the config exactly as NeMo-RL's ``run_grpo.py`` reads it;
- :mod:`.rules`: what ``--dry-run`` checks (each rule returns errors and warnings);
- :mod:`.plan`: the run plan, section by section;
- :mod:`.train`: the entry point (``nemo-mmpo train``, ``examples/run_mmpo_math.py``);
- :mod:`.checkout`, :mod:`.environment`: where NeMo-RL is, and which Python runs.
"""
