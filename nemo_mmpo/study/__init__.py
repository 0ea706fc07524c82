"""Seeded comparisons of objectives through NeMo-RL's loop on the CPU rig (issue: evidence).

- :mod:`.methods`: the paper's methods and ablations, as overrides of the tiny recipe;
- :mod:`.runner`: ``nemo-mmpo study run``, methods x seeds, paired, resumable;
- :mod:`.comparison`: ``nemo-mmpo study report``, the numbers and tables like the paper's;
- :mod:`.figures`: its figures.
"""
