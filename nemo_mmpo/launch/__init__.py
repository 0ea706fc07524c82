"""The launcher: from a recipe and overrides to a checked plan and a run.

- :mod:`.rules`: what ``--dry-run`` checks (each rule returns errors and warnings);
- :mod:`.plan`: the run plan, section by section;
- :mod:`.train`: the entry point (``nemo-mmpo train``, ``examples/run_mmpo_math.py``);
- :mod:`.environment`: which Python runs the entry point (standard library only);
- :mod:`.keys`: the keys a recipe takes and the metrics a run logs, as ``docs/keys.md``'s tables.

The recipe is read by :mod:`nemo_mmpo.recipes` (the config exactly as NeMo-RL's ``run_grpo.py``
reads it), NeMo-RL's checkout found by :mod:`nemo_mmpo.checkout`, and what its version can do
read by :mod:`nemo_mmpo.nemo_rl.versions`.
"""
