"""What differs between NeMo-RL versions, read from a checkout's code rather than its version.

A NeMo-RL checkout's ``package_info.py`` does not say which fixes it has (main says 0.6.0), so
each fact parses the relevant function with :mod:`ast`. ``--dry-run``'s rules and the CPU
driver read them; nothing here imports ``nemo_rl``.
"""

from __future__ import annotations

import ast
from pathlib import Path

#: The statement of NeMo-RL v0.7.0's fused packed loss that overruns a row (see below).
_UNCLAMPED_COPY = "input_ids[i, :actual_len]"


def fused_packing_overruns_rows(nemo_rl_root: Path) -> bool:
    """Whether this checkout's fused packed loss copies more tokens than a row holds.

    ``policy.sequence_packing.fuse_loss: true`` computes the loss through ``_pack_input_ids``
    (``nemo_rl/algorithms/loss/utils.py``), which builds each packed sequence's targets from
    ``input_ids[i, :actual_len]`` with ``actual_len`` read from the packed boundaries. When the
    packer pads a packed row (to the longest micro-batch's under pipeline parallel, to a
    multiple of 16 to 128 tokens under FP8 or HybridEP token dispatch), the last sequence
    absorbs the padding, its length exceeds the row, and the copy stops with a shape error:
    NeMo-RL v0.7.0. Main clamps the copy to the row. The code is read, not the version
    (main's ``package_info.py`` says 0.6.0); a checkout without the function has no fused loss.
    """
    source = nemo_rl_root / "nemo_rl" / "algorithms" / "loss" / "utils.py"
    if not source.is_file():
        return False
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.name == "_pack_input_ids":
            return any(
                isinstance(statement, ast.Assign)
                and ast.unparse(statement.value) == _UNCLAMPED_COPY
                for statement in ast.walk(node)
            )
    return False


def pipeline_stages_divided_by_temperature(nemo_rl_root: Path) -> bool:
    """Whether this checkout's Megatron forward step divides every pipeline stage's output by
    the sampler's temperature.

    ``forward_with_post_processing_fn`` (``nemo_rl/models/megatron/train.py``) calls
    ``apply_temperature_scaling`` on the model's output before the loss or log-prob
    post-processor; on a stage other than the last that output is the hidden state handed to the
    next stage, so under pipeline parallel with ``policy.generation.temperature != 1`` each
    stage boundary divides the residual stream too and the log-probs are not those of the model
    vLLM samples from (v0.7.0 and main of 2026-08-22; pinned in
    ``tests/nemo_rl_adapter/test_megatron_layouts.py``). A checkout whose function tests the
    pipeline stage (``is_pipeline_last_stage``) has a fix.
    """
    source = nemo_rl_root / "nemo_rl" / "models" / "megatron" / "train.py"
    if not source.is_file():
        return False
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.name == "forward_with_post_processing_fn":
            names = {
                ast.unparse(n) for n in ast.walk(node) if isinstance(n, ast.Name | ast.Attribute)
            }
            scales = any(name.endswith("apply_temperature_scaling") for name in names)
            return scales and not any(name.endswith("is_pipeline_last_stage") for name in names)
    return False


#: NeMo-RL's fix of the async resume deadlock (merged after v0.7.0).
ASYNC_RESUME_FIX = "NVIDIA-NeMo/RL#3066"


def async_resume_can_stall(nemo_rl_root: Path) -> bool:
    """Whether this checkout's ``async_grpo_train`` can wait forever after a resume.

    A checkpoint of an async run holds the replay buffer, with the next step's trajectories.
    Resumed at step N, the trainer finds step N complete, trains and refits at once; the
    trajectory collector, if it had not yet reserved step N+1 (its first dataloader batch is
    slower than a short step), then generates from N+2 on, and step N+1 never comes: v0.7.0.
    Main waits before its first step until step N+1 is complete or claimed
    (:data:`ASYNC_RESUME_FIX`). The code is read, not the version: a checkout whose
    ``async_grpo_train`` checks the next step's batch (``has_complete_batch`` of ``step + 1``)
    before training has the fix.
    """
    source = nemo_rl_root / "nemo_rl" / "algorithms" / "grpo.py"
    if not source.is_file():
        return False
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.name == "async_grpo_train":
            return not any(
                isinstance(call, ast.Call)
                and ast.unparse(call.func).endswith("has_complete_batch.remote")
                and call.args
                and ast.unparse(call.args[0]) == "step + 1"
                for call in ast.walk(node)
            )
    return False


def async_batches_needed(max_num_steps: int) -> int:
    """Dataloader batches NeMo-RL's async trainer needs for ``max_num_steps`` steps.

    It reads the training dataloader once (``grpo.max_num_epochs`` does not apply), and its
    trajectory collector needs one batch beyond the last step: when the dataloader ends it
    stops and drops the generation in flight. Short of that, v0.7.0 waits forever for the last
    step's trajectories and main stops with an error.
    """
    return max_num_steps + 1
