"""The CPU rig's answers for NeMo-RL main's single controller
(``nemo_rl/algorithms/single_controller_utils/setup.py``, main 7ea279ab), applied in the rig's
driver around one call of NeMo-RL's own ``setup_single_controller``; NeMo-RL's files stay
untouched and everything else that function builds is NeMo-RL's (the resume from the newest
checkpoint and the dataloader's state, the data-plane client, the weight synchronizer, the
estimator and loss through ``install()``, the TransferQueue replay buffer, the rollout manager).

What a CPU lacks, each answered by replacing one module-level name of ``setup.py`` while
:func:`answered` runs:

- ``_build_clusters`` (``:129``) builds its clusters with ``use_gpus=True`` (``:147, 184, 193``),
  which a Ray cluster without GPUs refuses (``ResourceInsufficientError``,
  ``virtual_cluster.py:896``): the answer builds the same two clusters (train: one bundle per
  Megatron rank; inference: one bundle) with ``use_gpus=False``, as the rig's other runs do.
  Fake ``GPU`` resources would not do: each Megatron rank would take its fake GPU id as its
  device (``megatron_policy_worker.py:438-441``).
- ``_build_generation`` (``:200``) builds ``VllmGeneration`` from ``policy.generation``: the
  answer builds the rig's (NeMo-RL's class, plus the rig's sampling helpers) from the same
  section completed for vLLM's CPU build
  (:func:`~nemo_mmpo.cpu.engines.vllm_generation.cpu_generation_config`).
- ``_build_trainer`` (``:285``) builds ``TQPolicy`` from ``policy``: the answer builds the same
  class on the same cluster from that section completed for the Megatron workers on CPU
  (:func:`~nemo_mmpo.cpu.engines.megatron_policy.megatron_policy_config`).
- ``setup_response_data`` (``:590``) reads the recipe's ``data`` section (a Hugging Face
  dataset): the answer hands over the rig's task records and NeMo-RL's ``MathEnvironment`` actor
  the rig started.

The Megatron worker's split training API (``begin_train_step``, micro-batches,
``finish_train_step``: ``megatron_policy_worker.py:1297, 1372, 1546, 1800``) and the weight
synchronizer's collective transfer (``collective_weight_synchronizer.py``) need no answer here:
their CUDA tensors, ``torch.cuda.synchronize`` and NCCL broadcast are the kinds
:mod:`~nemo_mmpo.cpu.answers.megatron_shims` and :mod:`~nemo_mmpo.cpu.answers.vllm_shims`
answer already (CPU tensor factories, the weights through :mod:`~nemo_mmpo.cpu.answers.vllm_refit`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from nemo_mmpo.cpu.answers import import_hooks
from nemo_mmpo.nemo_rl import run_state

SETUP = "nemo_rl.algorithms.single_controller_utils.setup"


@contextmanager
def answered(
    *,
    megatron_ranks: int,
    start_generation: Callable[[Any, Any], Any],
    start_trainer: Callable[[Any, Any, Any, Any], Any],
    records: list[Any],
    environment: Any,
) -> Iterator[dict[str, Any]]:
    """NeMo-RL's ``setup.py`` with the four answers of the module's text while the block runs.

    Args:
        megatron_ranks: the Megatron workers (``cpu_backend.megatron_ranks``): the train
            cluster's bundles.
        start_generation: ``(inference cluster, master_config) -> VllmGeneration`` on vLLM's
            CPU build (the rig's engines), its model loaded.
        start_trainer: ``(train cluster, master_config, weights_path, optimizer_path) ->
            TQPolicy`` over the Megatron workers on CPU (the rig's engines).
        records: the task's training records (NeMo-RL's ``DatumSpec``).
        environment: NeMo-RL's ``MathEnvironment`` actor.

    Yields:
        ``{"clusters": [...], "generation": ..., "trainer": ...}`` as they are built, for the
        rig to shut down afterwards.
    """
    import_hooks.refuse_on_cuda("the single controller's CPU answers")
    import importlib

    from nemo_rl.distributed.virtual_cluster import RayVirtualCluster

    from nemo_mmpo.cpu.answers import transfer_queue

    setup = importlib.import_module(SETUP)
    built: dict[str, Any] = {"clusters": [], "generation": None, "trainer": None}

    def cpu_cluster(name: str, bundles: int) -> Any:
        cluster = RayVirtualCluster(
            name=name,
            bundle_ct_per_node_list=[bundles],
            use_gpus=False,
            num_gpus_per_node=bundles,
            max_colocated_worker_groups=1,
        )
        built["clusters"].append(cluster)
        return cluster

    def build_clusters(master_config: Any) -> tuple[Any, Any]:
        if master_config.policy["generation"]["colocated"]["enabled"]:
            raise ValueError(
                "the CPU rig runs the single controller with generation in a cluster of its "
                "own: set policy.generation.colocated.enabled=false"
            )
        return (
            cpu_cluster("sc_train_cluster", megatron_ranks),
            cpu_cluster("sc_inference_cluster", 1),
        )

    def build_generation(inference_cluster: Any, master_config: Any, **kwargs: Any) -> Any:
        if kwargs.get("defer_model_load"):
            raise ValueError("NeMo-Gym's deferred generation is not answered on the CPU rig")
        built["generation"] = start_generation(inference_cluster, master_config)
        return built["generation"], 0.0

    def build_trainer(
        train_cluster: Any,
        master_config: Any,
        tokenizer: Any,  # NeMo-RL's call passes these names; the rig's tokenizer is the same
        processor: Any,
        *,
        weights_path: Any,
        optimizer_path: Any,
    ) -> tuple[Any, float]:
        transfer_queue.install()
        trainer = start_trainer(train_cluster, master_config, weights_path, optimizer_path)
        built["trainer"] = trainer
        return trainer, 0.0

    def response_data(tokenizer: Any, data_config: Any, env_configs: Any = None) -> tuple:
        return records, None, {"math": environment}, None

    answers = {
        "_build_clusters": build_clusters,
        "_build_generation": build_generation,
        "_build_trainer": build_trainer,
        "setup_response_data": response_data,
    }
    previous = {name: getattr(setup, name) for name in answers}
    for name, answer in answers.items():
        setattr(setup, name, answer)
    # install()'s setup_single_controller hook lets a cluster without GPUs through only now
    run_state.RUN.cpu_rig_answers_single_controller = True
    try:
        yield built
    finally:
        run_state.RUN.cpu_rig_answers_single_controller = False
        for name, original in previous.items():
            setattr(setup, name, original)
