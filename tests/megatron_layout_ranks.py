"""NeMo-RL's ``Policy`` and ``MegatronPolicyWorker`` on gloo rank processes, without Ray.

``tests/nemo_rl_adapter/test_megatron_layouts.py`` writes a spec (``torch.save``) and runs
:func:`main` in a fresh interpreter (``python -c "from megatron_layout_ranks import main;
main()" SPEC OUT``). That process installs the worker's CPU answers
(:mod:`nemo_mmpo.cpu.answers.megatron_shims`), imports NeMo-RL's worker, Megatron-Bridge and
megatron-core once, then for each launch forks ``world`` ranks (:mod:`gloo_ranks`). In each
rank, for each layout in turn, NeMo-RL's own ``Policy`` is built around this rank's
``MegatronPolicyWorker`` (:class:`LocalWorkerGroup` stands in for Ray's worker group: the rank
is the actor; what Ray would carry between the driver and the actors is gathered over gloo),
so ``Policy.get_logprobs`` and ``Policy.train`` shard, call the worker and gather as on a
cluster. The worker imports the tiny Llama's Hugging Face folder through Megatron-Bridge (once:
NeMo-RL caches the import) and, per layout, sets up its own process group and megatron-core's
parallel state (``setup.py:207-215`` destroys the previous layout's first;
:func:`forget_the_layout` resets the rest a fresh process would not hold).

Per layout the rank takes :data:`LOSSES` steps in turn (``mmpo``, ``dmpo``, NeMo-RL's
``clipped_pg``), each on :func:`step_data` built from the reference's log-probs before that
step; rank 0 writes ``OUT/launch-<i>.pt``: per layout the log-probs before the steps, and per
step the loss, gradient norm, log-probs after it and what each rank's model was given
(:data:`PLACE_KEY`); the largest difference between data/context replicas' parameters after
the steps; or, for a layout that may fail, the error and where it was raised.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from gloo_ranks import free_ports, run_launch

#: The steps every layout takes, in this order, one optimizer step each.
LOSSES = ("mmpo", "dmpo", "clipped_pg")
#: Where the batch carries each token's place in the whole batch (``row * seq_len + pos + 1``;
#: 0 is padding). NeMo-RL packs this key as it packs the tokens and hands it to the model as
#: ``loss_mask`` (for Multi-Token Prediction, which the tiny model has not: it reads nothing
#: from it); a hook on the model records, per micro-batch, which places each rank was given.
PLACE_KEY = "mtp_loss_mask"
#: The axes of NeMo-RL's worker sharding (``lm_policy.py``: ``NamedSharding`` names).
AXES = ("pipeline_parallel", "data_parallel", "context_parallel", "tensor_parallel")


def token_places(input_ids: torch.Tensor) -> torch.Tensor:
    """``[batch, seq_len]`` each token's place in the flattened batch, plus one."""
    return torch.arange(1, input_ids.numel() + 1).reshape(input_ids.shape)


class LocalCluster:
    """What ``Policy.__init__`` asks of its ``RayVirtualCluster``: the world size."""

    _sorted_bundle_indices = None

    def __init__(self, world: int) -> None:
        self.world = world
        self.num_gpus_per_node = world

    def world_size(self) -> int:
        return self.world


class LocalWorkerBuilder:
    """``RayWorkerBuilder(fqn, config, **kwargs)``: builds the class Ray would start as the
    actor (the ``@ray.remote`` class's own), here in this rank."""

    def __init__(self, class_fqn: str, config: dict, **kwargs: Any) -> None:
        self.class_fqn, self.config, self.kwargs = class_fqn, config, kwargs

    def build(self) -> Any:
        module, name = self.class_fqn.rsplit(".", 1)
        actor = getattr(importlib.import_module(module), name)
        metadata = getattr(actor, "__ray_metadata__", None)
        worker_class = metadata.modified_class if metadata is not None else actor
        return worker_class(self.config, **self.kwargs)


class LocalWorkerGroup:
    """``RayWorkerGroup`` for one rank: this process's worker, called with its data-parallel
    shard; the results Ray would return to the driver (one per data-parallel rank, from the
    ranks at 0 on the replicated axes) gathered over gloo."""

    def __init__(
        self,
        cluster: LocalCluster,
        builder: LocalWorkerBuilder,
        *,
        sharding_annotations: Any,
        env_vars: dict | None = None,
        **_: Any,
    ) -> None:
        os.environ.update(env_vars or {})
        self.cluster, self.sharding = cluster, sharding_annotations
        self.worker = builder.build()

    def run_all_workers_sharded_data(
        self,
        method_name: str,
        *,
        data: list,
        in_sharded_axes: list[str],
        replicate_on_axes: list[str],
        output_is_replicated: list[str],
        common_kwargs: dict | None = None,
    ) -> tuple[Any, list[str]]:
        assert in_sharded_axes == ["data_parallel"], in_sharded_axes
        here = self.sharding.get_worker_coords(dist.get_rank())
        method = getattr(self.worker, method_name)
        return method(
            data=data[here["data_parallel"]], **(common_kwargs or {})
        ), output_is_replicated

    def shutdown(self, *args: Any, **kwargs: Any) -> bool:
        """``Policy.__del__``'s call: the rank's worker ends with the rank."""
        return True

    def get_all_worker_results(self, futures: tuple[Any, list[str]]) -> list[Any]:
        result, replicated = futures
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, result)
        return [
            value
            for rank, value in enumerate(everyone)
            if all(self.sharding.get_worker_coords(rank)[axis] == 0 for axis in replicated)
        ]


def local_policy(config: dict, tokenizer: Any, world: int) -> Any:
    """NeMo-RL's ``Policy(config)`` on a cluster of ``world`` ranks, this rank's worker in
    this process (``lm_policy.py``'s Ray names answered while it is built)."""
    from nemo_rl.models.policy import lm_policy

    saved = {
        name: getattr(lm_policy, name)
        for name in ("RayQueue", "RayWorkerBuilder", "RayWorkerGroup")
    }
    lm_policy.RayQueue = lambda *args, **kwargs: None
    lm_policy.RayWorkerBuilder = LocalWorkerBuilder
    lm_policy.RayWorkerGroup = LocalWorkerGroup
    try:
        return lm_policy.Policy(
            cluster=LocalCluster(world),
            config=config,
            tokenizer=tokenizer,
            init_optimizer=True,
            init_reference_model=False,
        )
    finally:
        for name, value in saved.items():
            setattr(lm_policy, name, value)


def model_chunks(policy: Any) -> list[Any]:
    """This rank's model (megatron-core's DDP around the ``GPTModel``), as a list of chunks."""
    model = policy.worker_group.worker.model
    return list(model) if isinstance(model, list) else [model]


def record_calls(policy: Any) -> list[dict[str, Any]]:
    """Per forward call of this rank's model: the input's shape, whether it was packed, the
    places (:data:`PLACE_KEY`) of its tokens."""
    calls: list[dict[str, Any]] = []

    def hook(module: Any, args: tuple, kwargs: dict) -> None:
        places = kwargs.get("loss_mask")
        places = places.long() if places is not None else torch.zeros(0, dtype=torch.long)
        calls.append(
            {
                "shape": tuple(kwargs["input_ids"].shape),
                "packed": kwargs.get("packed_seq_params") is not None,
                "places": sorted(places[places > 0].tolist()),
            }
        )

    for chunk in model_chunks(policy):
        chunk.module.register_forward_pre_hook(hook, with_kwargs=True)
    return calls


def step_data(spec: dict, step: int, logprobs: torch.Tensor) -> Any:
    """The ``train_data`` of step ``step``: ``spec['batch']`` with ``prev_logprobs`` the
    policy's log-probs before the step plus ``spec['prev_noise'][step]`` (as at a later
    optimizer step: some ratios are clipped, on both sides), and for ``dmpo`` the penalty's
    batch terms (what ``grpo_train`` attaches)."""
    from nemo_mmpo.nemo_rl.dmpo_batch_terms import attach_penalty_terms

    data = spec["batch"].select_indices(list(range(spec["batch"].size)))
    mask = data["token_mask"].to(logprobs.dtype)
    prev = torch.zeros_like(data["prev_logprobs"])
    noise = spec["prev_noise"][step]
    prev[:, 1:] = ((logprobs[:, 1:] + noise[:, 1:]) * mask[:, 1:]).to(prev.dtype)
    data["prev_logprobs"] = prev
    data["generation_logprobs"] = prev.clone()
    if LOSSES[step] == "dmpo":
        attach_penalty_terms(data, spec["dmpo_settings"])
    return data


def replica_gap(policy: Any) -> float:
    """Largest difference between this layout's parameters and those of the same tensor- and
    pipeline-parallel shard on another data/context-parallel rank."""
    from megatron.core import parallel_state as ps

    here = (ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank())
    params = {
        name: p.detach().clone()
        for chunk in model_chunks(policy)
        for name, p in chunk.named_parameters()
    }
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (here, params))
    gap = 0.0
    for where, theirs in everyone:
        if where == here:
            for name, tensor in theirs.items():
                gap = max(gap, float((tensor - params[name]).abs().max()))
    return gap


def run_layout(layout: dict, spec: dict, reference: dict | None) -> dict:
    """Log-probs, then one step per loss (each followed by log-probs) under ``layout``;
    ``reference`` (None: this is the reference) gives each step's ``train_data``."""
    os.environ["MASTER_PORT"] = str(layout["port"])
    policy = local_policy(layout["policy"], spec["tokenizer"], layout["world"])
    try:
        assert policy.sharding_annotations.get_axis_size("data_parallel") == layout["data"]
        calls = record_calls(policy)
        before = policy.get_logprobs(spec["batch"])["logprobs"]
        result: dict[str, Any] = {"logprobs": before, "steps": {}}
        if layout.get("logprobs_only"):
            return result
        logprobs = before
        for step, name in enumerate(LOSSES):
            data = step_data(spec, step, logprobs if reference is None else reference[step])
            calls.clear()
            try:
                metrics = policy.train(data, spec["losses"][name])
            except Exception as error:
                if not layout.get("may_fail"):
                    raise
                frames = traceback.extract_tb(error.__traceback__)
                result["error"] = {
                    "loss": name,
                    "error": f"{type(error).__name__}: {error}",
                    "raised_in": [(Path(f.filename).name, f.name) for f in frames],
                }
                return result
            seen = list(calls)
            logprobs = policy.get_logprobs(spec["batch"])["logprobs"]
            result["steps"][name] = {
                "loss": float(metrics["loss"]),
                "grad_norm": float(metrics["grad_norm"]),
                "logprobs": logprobs,
                "calls": seen,
            }
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, [step["calls"] for step in result["steps"].values()])
        result["calls_per_rank"] = everyone
        result["replica_gap"] = replica_gap(policy)
        return result
    finally:
        del policy
        gc.collect()
        forget_the_layout()


def forget_the_layout() -> None:
    """What a fresh worker process would not hold and NeMo-RL's ``setup_distributed`` does not
    reset (it destroys the process group and megatron-core's parallel state): megatron-core's
    process-global micro-batch calculator and rerun state machine, which
    ``initialize_megatron`` (Megatron-Bridge ``initialize.py:115``) refuses to set twice."""
    from megatron.core import num_microbatches_calculator, rerun_state_machine

    num_microbatches_calculator.destroy_num_microbatches_calculator()
    rerun_state_machine.destroy_rerun_state_machine()


def run_rank(rank: int, world: int, launch: dict, spec: dict, out: Path) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0"})
    results = {}
    for layout in launch["layouts"]:
        try:
            results[layout["name"]] = run_layout(layout, spec, spec.get("reference_steps"))
        except Exception:
            if not layout.get("may_fail"):
                raise
            # a peer's failure (its stage ended): the failing rank reports it
            results[layout["name"]] = {"error": None, "peer": traceback.format_exc()[-2000:]}
        if layout.get("may_fail") and "error" in results[layout["name"]]:
            torch.save(results, out / f"launch-{launch['index']}-rank{rank}.pt")
            os._exit(0)  # the other stage waits for this one: ending it ends their wait
    if rank == 0:
        torch.save(results, out / f"launch-{launch['index']}.pt")


def answer_ray_in_ranks() -> None:
    """The ranks are the actors: Ray's ``get_gpu_ids()`` (``megatron_policy_worker.py:263``)
    would start a local Ray instance here; a Ray GPU actor is given one device, its id 0."""
    import ray

    ray.get_gpu_ids = lambda: [0]


def main() -> None:
    spec_path, out = Path(sys.argv[1]), Path(sys.argv[2])
    torch.set_num_threads(1)  # ranks share two cores; and fork before any thread pool starts
    from nemo_mmpo.cpu.answers import megatron_shims
    from nemo_mmpo.cpu.answers.import_hooks import CPU_ANSWERS_ENV

    answer_ray_in_ranks()
    os.environ[CPU_ANSWERS_ENV] = "1"  # the CPU rig's ranks ask for its answers explicitly
    megatron_shims.install_on_import()
    megatron_shims.answer_torch()
    # import NeMo-RL's worker (Megatron-Bridge, megatron-core) once, before forking
    import nemo_rl.models.policy.lm_policy
    import nemo_rl.models.policy.workers.megatron_policy_worker  # noqa: F401

    spec = torch.load(spec_path, weights_only=False)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "TORCH_CUDA_ARCH_LIST": "cpu"})
    for launch in spec["launches"]:
        # the launch's gloo group and each layout's group (NeMo-RL's setup_distributed), distinct
        launch["port"], *ports = free_ports(1 + len(launch["layouts"]))
        for layout, port in zip(launch["layouts"], ports, strict=True):
            layout["port"] = port
        run_launch(launch, spec, out, run_rank)
        if launch["index"] == 0:  # the reference: its log-probs before each step
            steps = torch.load(out / "launch-0.pt", weights_only=False)[
                launch["layouts"][0]["name"]
            ]
            spec["reference_steps"] = [steps["logprobs"]] + [
                steps["steps"][name]["logprobs"] for name in LOSSES[:-1]
            ]
