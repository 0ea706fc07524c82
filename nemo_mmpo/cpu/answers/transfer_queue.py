"""The CPU rig's answer for NeMo-RL main's TransferQueue adapter
(``nemo_rl/data_plane/adapters/transfer_queue.py``, main 7ea279ab), applied in the rig's driver
before NeMo-RL's ``TQPolicy`` bootstraps the data plane
(:func:`nemo_mmpo.cpu.rig.data_plane.start_tq_megatron_policy`); NeMo-RL's file stays untouched.

- ``_init_tq`` (``:301``) calls ``_patch_tq_actor_runtime_env`` (``:133``), which reads the
  ``TransferQueue`` requirement from NeMo-RL's installed metadata (``_resolve_tq_pin``,
  ``:123``: ``importlib.metadata.requires("nemo-rl")``) to make Ray pip-install it into every
  TransferQueue actor (for multi-node containers whose nodes lack it). The rig runs NeMo-RL from
  its source on ``PYTHONPATH`` (not installed: ``PackageNotFoundError``), on one machine whose
  environment already has transferqueue (``scripts/nemo_rl_requirements.txt``), and offline: the
  answer sets the adapter's own flag ``_TQ_RUNTIME_ENV_PATCHED`` (``:111``), with which
  ``_patch_tq_actor_runtime_env`` returns at once, so TransferQueue's actors run in the driver's
  environment, as NeMo-RL's other actors do in the rig.

The Megatron worker's TransferQueue paths need no answer of their own: the replica group
(``megatron_policy_worker.py:366, 381``: a ``device="cuda"`` tensor and ``new_group(backend=
"nccl")``) and the mixin's broadcast device (``worker_mixin.py:72``, from the group's backend)
are met by :mod:`nemo_mmpo.cpu.answers.megatron_shims` (CPU tensor factories, gloo groups).
"""

from __future__ import annotations

from typing import Any

from nemo_mmpo.cpu.answers import import_hooks

ADAPTER = "nemo_rl.data_plane.adapters.transfer_queue"


def _answer_adapter(module: Any) -> None:
    """No per-actor ``pip`` runtime env for TransferQueue's actors (see the module's text)."""
    if hasattr(module, "_TQ_RUNTIME_ENV_PATCHED"):
        module._TQ_RUNTIME_ENV_PATCHED = True


AFTER_IMPORT: import_hooks.Shims = {ADAPTER: _answer_adapter}


def install() -> None:
    """The adapter's answer in this process (now, or when the adapter is imported)."""
    import_hooks.install(AFTER_IMPORT)
