"""Apply CPU answers to a module when it is first imported (NeMo-RL's and the engines' files
stay untouched): :class:`~nemo_mmpo.on_import.ShimOnImport`, a ``sys.meta_path`` finder that
runs a function before and/or after a named module executes, installed by :func:`install`.
Used by :mod:`nemo_mmpo.cpu.answers.vllm_shims` and :mod:`nemo_mmpo.cpu.answers.megatron_shims`,
installed in Ray's worker processes by their ``worker_process_setup_hook``.

:func:`refuse_on_cuda`: the answers are for a CPU; every install of them calls it first, so
they never reach a process that sees a CUDA device unless the CPU rig asks for them explicitly
(:data:`CPU_ANSWERS_ENV`)."""

from __future__ import annotations

import os
import sys

from nemo_mmpo.on_import import ShimOnImport, Shims

__all__ = ["CPU_ANSWERS_ENV", "ShimOnImport", "Shims", "install", "refuse_on_cuda"]

#: Set to ``1`` by the CPU rig (its Ray workers' ``runtime_env``,
#: :func:`nemo_mmpo.cpu.engines.ray_cluster.start_ray`): install the answers even where torch
#: sees a CUDA device (a CPU rig on a machine that has a GPU).
CPU_ANSWERS_ENV = "NEMO_MMPO_CPU_ANSWERS"


def refuse_on_cuda(what: str) -> None:
    """Raise, installing nothing, where torch sees a CUDA device and the CPU rig did not ask
    (:data:`CPU_ANSWERS_ENV`): the answers would keep a GPU run's tensors on the CPU and its
    collectives on gloo."""
    if os.environ.get(CPU_ANSWERS_ENV) == "1":
        return
    import torch

    if torch.cuda.is_available():
        raise RuntimeError(
            f"nemo-mmpo: {what} are the CPU rig's answers to CUDA assumptions (tensors kept on "
            "the CPU, NCCL replaced by gloo), and this process sees a CUDA device: nothing was "
            "installed. A GPU run needs none of them: remove what installs them (a Ray "
            "worker_process_setup_hook or setup naming nemo_mmpo.cpu.answers, a recipe with "
            f"cpu_backend.enabled=true). The CPU rig on a machine with a GPU sets "
            f"{CPU_ANSWERS_ENV}=1"
        )


def install(after: Shims, before: Shims | None = None) -> None:
    """``after`` applied now to modules already imported; both on later imports (once per
    set of shims: a second call with the same ``after`` adds nothing). Refused where torch
    sees a CUDA device (:func:`refuse_on_cuda`)."""
    refuse_on_cuda("the import-time answers (nemo_mmpo.cpu.answers)")
    for name, shim in after.items():
        if name in sys.modules:
            shim(sys.modules[name])
    if not any(
        isinstance(finder, ShimOnImport) and finder.after is after for finder in sys.meta_path
    ):
        sys.meta_path.insert(0, ShimOnImport(after, before))
