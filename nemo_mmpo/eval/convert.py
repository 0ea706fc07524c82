"""A checkpoint's weights as a Hugging Face folder, with NeMo-RL's own converter.

NeMo-RL saves DTensor policies as Hugging Face folders (consolidated saves) and Megatron
policies as ``torch_dist`` checkpoints (``<step>/policy/weights/iter_*``).
:func:`hugging_face_weights` returns the first as it is and converts the second with
NeMo-RL's ``examples/converters/convert_megatron_to_hf.py``, run unchanged in a fresh process
(``--config <step>/config.yaml``: the model NeMo-RL's run imported, its architecture and
tokenizer) with the interpreter NeMo-RL gives its Megatron policy worker (NeMo-RL's driver
environment has no Megatron: :func:`~nemo_mmpo.eval.worker_environments.worker_python`),
nemo-mmpo on its ``PYTHONPATH``. The watcher (``nemo-mmpo eval watch``), the CPU rig's
learning check and its seed spread all convert through :func:`megatron_to_hugging_face`.

A checkpoint written by the CPU rig's Megatron workers is read by Megatron-Bridge in the
converter's process as in the workers: with the rig's answers to CUDA assumptions installed
first (``setup``: the names of the functions that install them, as Ray's
``worker_process_setup_hook`` names one; :data:`CPU_RIG_CONVERTER_SETUP`). A GPU run's
converter gets none.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.worker_environments import MEGATRON_WORKER, worker_environment, worker_python

#: NeMo-RL's converter, inside its checkout
CONVERTER = Path("examples") / "converters" / "convert_megatron_to_hf.py"
#: The CPU rig's answers for NeMo-RL's Megatron modules and Megatron-Bridge (the workers' Ray
#: setup hook, then the torch-level answers the workers get when NeMo-RL's worker imports),
#: for the converter's process; named, not imported: this layer sits below the rig's
#: (``nemo_mmpo.cpu``), and ``tests/cpu/test_tiny_run_megatron.py`` converts with them.
CPU_RIG_CONVERTER_SETUP = (
    "nemo_mmpo.cpu.answers.megatron_shims.install_on_import",
    "nemo_mmpo.cpu.answers.megatron_shims.answer_torch",
)
#: The CPU rig's answers for vLLM's CPU build (its Ray setup hook), for a process that
#: samples with vLLM outside the rig's Ray workers (the watcher's ``--backend vllm``).
CPU_RIG_ENGINE_SETUP = ("nemo_mmpo.cpu.answers.vllm_shims.install_on_import",)
#: the last lines of the converter's output that an error message quotes
QUOTED_LINES = 3


def is_cpu_rig_recipe(config: Mapping[str, Any]) -> bool:
    """A recipe the CPU rig trains (``cpu_backend.enabled: true``; a GPU recipe may carry the
    section switched off): its checkpoints were written by workers with the rig's CPU
    answers, and are read back with them."""
    return bool((config.get("cpu_backend") or {}).get("enabled"))


def run_setup(setup: Sequence[str]) -> None:
    """Call each function named ``module.function`` in ``setup``, in order, in this process."""
    for name in setup:
        module, _, function = name.rpartition(".")
        getattr(importlib.import_module(module), function)()


def _converter_program(setup: Sequence[str]) -> str:
    """The converter's process: ``setup`` first, then NeMo-RL's script as ``__main__``."""
    return (
        "import runpy, sys\n"
        "from nemo_mmpo.eval.convert import run_setup\n"
        f"run_setup({list(setup)!r})\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )


def megatron_to_hugging_face(
    step_dir: Path,
    out: Path,
    nemo_rl_root: Path | None,
    setup: Sequence[str] = (),
    python: str | None = None,
) -> Path:
    """The Megatron checkpoint of NeMo-RL's ``step_dir`` (``step_<N>``: ``config.yaml`` and
    ``policy/weights/iter_*``) as the Hugging Face folder ``out``, by NeMo-RL's converter in a
    fresh process of ``python`` (default: the Megatron worker's, :data:`MEGATRON_WORKER`;
    ``setup`` called there first); written under a temporary name and renamed, so ``out`` is
    whole or absent. Errors are one line naming the checkpoint and the fix."""
    step_dir, out = Path(step_dir), Path(out)
    iterations = sorted((step_dir / "policy" / "weights").glob("iter_*"))
    if not iterations:
        raise MMPOInputError(
            f"{step_dir / 'policy' / 'weights'} holds no Megatron checkpoint (iter_*): give a "
            "step_<N> folder of a run with policy.megatron_cfg.enabled"
        )
    if not (step_dir / "config.yaml").is_file():
        raise MMPOInputError(
            f"{step_dir} has no config.yaml (NeMo-RL writes it with every checkpoint): give a "
            "whole step_<N> folder"
        )
    if nemo_rl_root is None:
        raise MMPOInputError(
            "converting a Megatron checkpoint needs NeMo-RL's converter: set NEMO_RL_PATH to "
            "NeMo-RL's checkout"
        )
    converter = Path(nemo_rl_root) / CONVERTER
    if not converter.is_file():
        raise MMPOInputError(
            f"{converter} does not exist: set NEMO_RL_PATH to a NeMo-RL checkout that has it"
        )
    python = python or worker_python(MEGATRON_WORKER)
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [
        python,
        "-c",
        _converter_program(setup),
        str(converter),
        "--config",
        str(step_dir / "config.yaml"),
        "--megatron-ckpt-path",
        str(iterations[-1]),
        "--hf-ckpt-path",
        str(partial),
    ]
    result = subprocess.run(command, capture_output=True, text=True, env=worker_environment(python))
    if result.returncode != 0 or not (partial / "config.json").is_file():
        shutil.rmtree(partial, ignore_errors=True)
        quoted = " | ".join((result.stderr or result.stdout).strip().splitlines()[-QUOTED_LINES:])
        raise MMPOInputError(
            f"NeMo-RL's converter failed on {iterations[-1]} (exit {result.returncode}): "
            f"{quoted or 'no output'}; run it by hand to see all: {python} {converter} --config "
            f"{step_dir / 'config.yaml'} --megatron-ckpt-path {iterations[-1]} --hf-ckpt-path DIR"
        )
    partial.rename(out)
    return out


def hugging_face_weights(
    step_dir: Path,
    work_dir: Path,
    nemo_rl_root: Path | None,
    setup: Sequence[str] = (),
    python: str | None = None,
) -> Path:
    """The weights of NeMo-RL's checkpoint ``step_dir`` as a Hugging Face folder:
    ``policy/weights`` itself when it is one (the CPU rig's ``transformers`` policy, DTensor
    with consolidated saves), else its Megatron checkpoint converted into
    ``work_dir/hf_<step_dir name>`` (reused when a conversion is already there) by
    :func:`megatron_to_hugging_face` with ``python``."""
    weights = Path(step_dir) / "policy" / "weights"
    if (weights / "config.json").is_file():
        return weights
    target = Path(work_dir) / f"hf_{Path(step_dir).name}"
    if (target / "config.json").is_file():
        return target
    if not any(weights.glob("iter_*")):
        raise MMPOInputError(
            f"{weights} holds neither a Hugging Face model (config.json) nor a Megatron "
            "checkpoint (iter_*): give the step_<N> folder of a NeMo-RL checkpoint"
        )
    return megatron_to_hugging_face(step_dir, target, nemo_rl_root, setup, python)
