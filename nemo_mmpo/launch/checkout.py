"""Where NeMo-RL is, and the link that lets our recipes inherit its configs.

Our recipes say ``defaults: nemo_rl/<file>.yaml``, a path relative to ``examples/configs``,
where :func:`link_nemo_rl_configs` keeps a symbolic link ``nemo_rl -> <NeMo-RL checkout>/
examples/configs``. NeMo-RL's own loader then resolves them unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

from nemo_mmpo.errors import MMPOInputError

#: NeMo-RL's checkout inside its container.
CONTAINER_NEMO_RL = Path("/opt/nemo-rl")
LINK_NAME = "nemo_rl"
#: This checkout's root and recipes (their ``defaults`` name ``nemo_rl/<file>.yaml``).
REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS_DIR = REPO_ROOT / "examples" / "configs"


def find_nemo_rl_root() -> Path | None:
    """NeMo-RL's checkout: ``$NEMO_RL_PATH``, the imported ``nemo_rl``'s, or the container's."""
    candidates = []
    if os.environ.get("NEMO_RL_PATH"):
        candidates.append(Path(os.environ["NEMO_RL_PATH"]))
    try:
        import nemo_rl

        candidates.append(Path(nemo_rl.__file__).resolve().parent.parent)
    except ImportError:
        pass
    candidates.append(CONTAINER_NEMO_RL)
    for candidate in candidates:
        if (candidate / "examples" / "configs").is_dir() and (candidate / "nemo_rl").is_dir():
            return candidate.resolve()
    return None


def link_nemo_rl_configs(nemo_rl_root: Path, configs_dir: Path = CONFIGS_DIR) -> Path:
    """Point ``configs_dir/nemo_rl`` at ``nemo_rl_root/examples/configs`` (idempotent)."""
    link = configs_dir / LINK_NAME
    target = (nemo_rl_root / "examples" / "configs").resolve()
    if link.is_symlink() and link.resolve() == target:
        return link
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        raise MMPOInputError(
            f"{link} exists and is not a link; remove it so nemo-mmpo can link NeMo-RL's configs"
        )
    link.symlink_to(target, target_is_directory=True)
    return link


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
    import ast

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
    import ast

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
