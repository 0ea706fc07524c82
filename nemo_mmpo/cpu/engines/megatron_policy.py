"""NeMo-RL's own Megatron policy on the CPU rig: NeMo-RL's ``Policy`` starting its
``MegatronPolicyWorker`` Ray actors (``cpu_backend.policy: megatron``, recipe
``mmpo_tiny_cpu_megatron.yaml``).

What a GPU run does, here with CPU workers: each worker imports the warm start's Hugging Face
folder through Megatron-Bridge's ``AutoBridge`` (into ``NRL_MEGATRON_CHECKPOINT_DIR``), builds
the model with Megatron-Bridge's provider, computes log-probs and trains with the loss NeMo-RL
hands it, saves Megatron (``torch_dist``) checkpoints and resumes from them, and sends its
exported weights to vLLM at every refit. The CPU answers the workers need are installed in
Ray's worker processes by :data:`~nemo_mmpo.cpu.answers.megatron_shims.SETUP_HOOK`; this module only
builds what NeMo-RL's ``setup()`` builds (the config it derives, the cluster, the ``Policy``).
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from nemo_rl.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl.models.policy.lm_policy import Policy

#: The warm start as a Hugging Face folder in the run's checkpoint directory: the policy's
#: ``model_name`` (Megatron-Bridge imports it; vLLM reads its config and tokenizer), the same
#: folder when the run resumes.
START_FOLDER = "hf_start"
#: Where NeMo-RL's workers put their Hugging Face -> Megatron import (its default is
#: ``~/.cache``), in the run's checkpoint directory.
IMPORT_FOLDER = "megatron_import"
#: NeMo-RL's ``Policy`` refuses to start without it (``lm_policy.py:121``); it names CUDA
#: architectures for kernels a CPU never builds.
CUDA_ARCHITECTURES = "TORCH_CUDA_ARCH_LIST"


def save_start_folder(model: Any, tokenizer: Any, checkpoint_dir: Path) -> Path:
    """``model`` and ``tokenizer`` as ``<checkpoint_dir>/hf_start`` (written once, by rename)."""
    folder = checkpoint_dir / START_FOLDER
    if folder.is_dir():
        return folder
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{START_FOLDER}.", dir=checkpoint_dir))
    try:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        os.replace(partial, folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder


def megatron_policy_config(
    policy: dict[str, Any], grpo: dict[str, Any], train_size: int, start_folder: Path
) -> dict[str, Any]:
    """NeMo-RL's ``policy`` section as its ``setup()`` hands it to ``Policy``: the model and
    tokenizer from ``start_folder``, ``megatron_cfg.train_iters`` as ``setup()`` derives it
    (``grpo.py:817-823``), and the import folder in the workers' environment."""
    config = copy.deepcopy(policy)
    config["model_name"] = str(start_folder)
    config["tokenizer"] = dict(config.get("tokenizer") or {}, name=str(start_folder))
    megatron = config["megatron_cfg"]
    megatron["train_iters"] = min(grpo["max_num_steps"], grpo["max_num_epochs"] * train_size)
    megatron["env_vars"] = dict(
        megatron.get("env_vars") or {},
        NRL_MEGATRON_CHECKPOINT_DIR=str(start_folder.parent / IMPORT_FOLDER),
    )
    return config


def start_megatron_policy(
    config: dict[str, Any],
    tokenizer: Any,
    workers: int,
    weights_path: str | None = None,
    optimizer_path: str | None = None,
    policy_class: type | None = None,
    cluster: Any = None,
    **policy_kwargs: Any,
) -> Any:
    """NeMo-RL's ``Policy`` on ``workers`` CPU bundles (a ``RayVirtualCluster`` without GPUs),
    from ``weights_path`` / ``optimizer_path`` when resuming (the worker's own Megatron
    checkpoint). The reference model is not built (the recipes have no KL term).
    ``policy_class`` (default NeMo-RL's ``Policy``) and ``policy_kwargs`` start a subclass the
    same way (``grpo_train_sync``'s ``TQPolicy`` and its ``dp_cfg``:
    :func:`nemo_mmpo.cpu.rig.data_plane.start_tq_megatron_policy`); ``cluster`` (default: a new
    one of ``workers`` CPU bundles) is one built already (the single controller's train
    cluster). The cluster is shut down if the policy fails to start."""
    os.environ.setdefault(CUDA_ARCHITECTURES, "cpu")
    if cluster is None:
        cluster = RayVirtualCluster(
            bundle_ct_per_node_list=[workers],
            use_gpus=False,
            num_gpus_per_node=workers,
            max_colocated_worker_groups=1,
            name="megatron_policy_cluster",
        )
    try:
        policy = (policy_class or Policy)(
            cluster=cluster,
            config=config,
            tokenizer=tokenizer,
            weights_path=weights_path,
            optimizer_path=optimizer_path,
            init_optimizer=True,
            init_reference_model=False,
            **policy_kwargs,
        )
    except BaseException:
        cluster.shutdown()
        raise
    policy.tokenizer = tokenizer  # read by the vLLM engine's setup (cpu_vllm_generation)
    policy.cluster = cluster  # shut down with it
    return policy


def shutdown_megatron_policy(policy: Any) -> None:
    """Stop the workers and release their placement group."""
    policy.shutdown()
    policy.cluster.shutdown()
