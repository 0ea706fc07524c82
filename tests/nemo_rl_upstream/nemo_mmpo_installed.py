"""pytest plugin: run NeMo-RL's own unit tests with nemo-mmpo installed into NeMo-RL.

``scripts/test_nemo_rl.sh`` runs ``tests/unit/algorithms`` of each NeMo-RL snapshot twice, with
``-p nemo_mmpo_installed`` and without, and fails if any test's outcome differs: installing
nemo-mmpo must change nothing for NeMo-RL's own estimators, losses and trainers.
"""

from __future__ import annotations


def pytest_configure(config):
    from nemo_mmpo.nemo_rl import install

    hooked = install()
    print(f"[nemo-mmpo] installed into NeMo-RL for its unit tests: {len(hooked)} names hooked")
