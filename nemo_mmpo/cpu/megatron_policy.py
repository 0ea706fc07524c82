"""The Megatron CPU policy: NeMo-RL's policy interface over a real megatron-core ``GPTModel``
split across Ray actors that meet over gloo, as NeMo-RL's Megatron workers meet over NCCL.

``cpu_backend.policy: megatron`` (recipe ``mmpo_tiny_cpu_megatron.yaml``). What runs for real:

- megatron-core's ``GPTModel`` of the tiny Llama (:mod:`nemo_mmpo.cpu.megatron_llama`), its
  parallel state (tensor, pipeline, context and data parallel from
  ``policy.megatron_cfg`` and ``cpu_backend.megatron_ranks``), DDP and Adam
  (``get_megatron_optimizer``), one Ray actor per rank (:class:`MegatronRank`);
- NeMo-RL's Megatron train step and log-prob pass (:mod:`nemo_mmpo.cpu.megatron_step`:
  ``Policy._shard_for_train`` / ``_shard_for_logprob``, ``process_global_batch``,
  ``get_microbatch_iterator``, ``megatron_forward_backward`` with ``LossPostProcessor`` /
  ``LogprobsPostProcessor``, ``aggregate_training_statistics``) with the loss NeMo-RL hands
  over (MMPO's, DMPO's or ``ClippedPGLossFn``);
- the refit's weights: the ranks' shards gathered and renamed to Hugging Face names
  (:func:`~nemo_mmpo.cpu.megatron_llama.megatron_to_hf`, the names NeMo-RL's Megatron refit
  sends vLLM), then published through Ray's object store (:mod:`nemo_mmpo.cpu.vllm_refit`).

What is ours: building the model and optimizer (NeMo-RL's ``MegatronPolicyWorker`` builds them
through Megatron-Bridge, which does not install here), the CPU shims
(:mod:`nemo_mmpo.cpu.megatron_cpu`), and the driver-side object below, which does what
NeMo-RL's ``Policy`` does with its worker group. :attr:`MegatronCPUPolicy.model` is a Hugging
Face copy of the current weights, gathered from the ranks when it is read after a step: the
transformers generation engine samples from it and checkpoints are saved from it (complete
Hugging Face folders, as the evaluation reads them); each rank saves its own optimizer state.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

import ray
import torch
from nemo_rl.distributed.batched_data_dict import BatchedDataDict
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from nemo_mmpo.cpu import vllm_refit
from nemo_mmpo.cpu.policy import DriverSidePolicy
from nemo_mmpo.cpu.rig_settings import Layout
from nemo_mmpo.errors import MMPOInputError

#: Seconds a rank waits in a gloo collective before failing (a hang fails instead of waiting).
COLLECTIVE_TIMEOUT_S = 600
#: The file in the optimizer folder naming the layout its per-rank states belong to.
LAYOUT_FILE = "megatron_layout.json"


class Sharding:
    """NeMo-RL's ``sharding_annotations`` for the layout (``get_axis_size``)."""

    def __init__(self, layout: Layout) -> None:
        self.sizes = {
            "tensor_parallel": layout.tensor,
            "pipeline_parallel": layout.pipeline,
            "context_parallel": layout.context,
            "data_parallel": layout.data,
        }

    def get_axis_size(self, name: str) -> int:
        return self.sizes[name]


def optimizer_settings(policy_config: dict[str, Any], learning_rate: float) -> dict[str, Any]:
    """megatron-core ``OptimizerConfig`` settings: Adam at ``learning_rate`` with torch's AdamW
    defaults (betas 0.9/0.999, eps 1e-8) and ``policy.megatron_cfg.optimizer.weight_decay``
    (default 0), clipping at ``policy.max_grad_norm``, float32 (the CPU policy's optimizer)."""
    megatron_optimizer = (policy_config.get("megatron_cfg") or {}).get("optimizer") or {}
    max_grad_norm = policy_config.get("max_grad_norm")
    return {
        "optimizer": "adam",
        "lr": float(learning_rate),
        "weight_decay": float(megatron_optimizer.get("weight_decay", 0.0)),
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "adam_eps": 1e-8,
        "clip_grad": float(max_grad_norm) if max_grad_norm else 0.0,
    }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@ray.remote(num_cpus=0)
class MegatronRank:
    """One rank of the model: megatron-core's parallel state over gloo, its part of the
    ``GPTModel`` in DDP, megatron-core's Adam, and NeMo-RL's train step and log-prob pass."""

    def __init__(
        self,
        rank: int,
        layout: Layout,
        port: int,
        hf_config: dict[str, Any],
        hf_weights: dict[str, torch.Tensor],
        policy_config: dict[str, Any],
        optimizer: dict[str, Any],
        seed: int,
    ) -> None:
        torch.set_num_threads(1)
        from nemo_mmpo.cpu import megatron_cpu

        megatron_cpu.install()  # this actor's process only
        import torch.distributed as dist
        from megatron.core import parallel_state
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        from nemo_mmpo.cpu.megatron_llama import hf_to_megatron, llama_settings
        from nemo_mmpo.cpu.megatron_model import load_full, tiny_gpt

        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=layout.ranks,
            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        )
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=layout.tensor,
            pipeline_model_parallel_size=layout.pipeline,
            context_parallel_size=layout.context,
        )
        megatron_cpu.cpu_rng_tracker(seed)
        self.rank = rank
        self.cfg = policy_config
        self.model = tiny_gpt(
            hf_config["vocab_size"],
            hf_config["max_position_embeddings"],
            llama_settings(hf_config),
        )
        load_full(self.model, hf_to_megatron(hf_weights, hf_config))
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(params_dtype=torch.float32, **optimizer), [self.model]
        )

    def coordinates(self) -> dict[str, Any]:
        from megatron.core import parallel_state as ps

        return {
            "rank": self.rank,
            "tp": ps.get_tensor_model_parallel_rank(),
            "pp": ps.get_pipeline_model_parallel_rank(),
            "cp": ps.get_context_parallel_rank(),
            "dp": ps.get_data_parallel_rank(),
            "last": ps.is_pipeline_last_stage(),
        }

    def logprobs(self, data: Any) -> tuple[torch.Tensor | None, Any]:
        from nemo_mmpo.cpu import megatron_step

        return megatron_step.logprobs(self.model, self.cfg, data)

    def train(self, data: Any, loss_fn: Any, eval_mode: bool, gbs: int, mbs: int) -> dict:
        from nemo_mmpo.cpu import megatron_step

        return megatron_step.train(
            self.model,
            self.optimizer,
            self.cfg,
            loss_fn,
            data,
            gbs=gbs,
            mbs=mbs,
            eval_mode=eval_mode,
        )

    def weight_pieces(self) -> dict[str, tuple[torch.Tensor, Any, int]]:
        """This rank's parameters by one-process name, with their split (to gather)."""
        from nemo_mmpo.cpu.megatron_model import local_pieces

        return local_pieces(self.model, "param")

    def save_optimizer(self, folder: str) -> None:
        """This rank's optimizer state, written by rename (no half-written file)."""
        path = Path(folder) / f"rank-{self.rank}.pt"
        partial = path.with_suffix(f".pt.tmp.{os.getpid()}")
        torch.save(self.optimizer.state_dict(), partial)
        os.replace(partial, path)

    def load_optimizer(self, folder: str) -> None:
        state = torch.load(Path(folder) / f"rank-{self.rank}.pt", weights_only=False)
        self.optimizer.load_state_dict(state)

    def leave(self) -> None:
        import torch.distributed as dist
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


class MegatronCPUPolicy(DriverSidePolicy):
    """NeMo-RL's ``ColocatablePolicyInterface`` over :class:`MegatronRank` actors.

    Args:
        model: the Hugging Face Llama the ranks start from (warm start or checkpoint); kept as
            :attr:`model`, the Hugging Face copy of the current weights.
        tokenizer: saved beside the weights in checkpoints.
        policy_config: NeMo-RL's ``policy`` section (batch sizes, ``max_grad_norm``,
            ``generation``, ``megatron_cfg``, ``dynamic_batching``, ``sequence_packing``).
        learning_rate: Adam's (``cpu_backend.learning_rate``).
        ranks: how many rank actors (``cpu_backend.megatron_ranks``: NeMo-RL's GPUs).
        seed: megatron-core's model-parallel RNG seed.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        policy_config: dict[str, Any],
        learning_rate: float,
        ranks: int = 2,
        seed: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.cfg = policy_config
        self.layout = Layout.from_config(policy_config, ranks)
        self.sharding_annotations = Sharding(self.layout)
        self.temperature = float((policy_config.get("generation") or {}).get("temperature", 1.0))
        self.steps = 0
        self.weight_mailbox: Any = None
        self._hugging_face = model
        self._stale = False
        port = _free_port()
        # on the driver's node: the ranks meet over gloo on 127.0.0.1
        node = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        weights = ray.put({name: t.detach().clone() for name, t in model.state_dict().items()})
        self.ranks = [
            MegatronRank.options(scheduling_strategy=node).remote(
                rank,
                self.layout,
                port,
                model.config.to_dict(),
                weights,
                policy_config,
                optimizer_settings(policy_config, learning_rate),
                seed,
            )
            for rank in range(self.layout.ranks)
        ]
        self.where = ray.get([rank.coordinates.remote() for rank in self.ranks])

    # --- the Hugging Face copy of the weights ---------------------------------------------
    @property
    def model(self) -> Any:
        """The current weights as the Hugging Face Llama (gathered after a step)."""
        if self._stale:
            self._gather_weights()
        return self._hugging_face

    def _gather_weights(self) -> None:
        from nemo_mmpo.cpu.megatron_llama import megatron_to_hf
        from nemo_mmpo.cpu.megatron_model import gather_full

        replica = [
            index for index, where in enumerate(self.where) if where["dp"] == 0 and where["cp"] == 0
        ]
        pieces = ray.get([self.ranks[index].weight_pieces.remote() for index in replica])
        state = megatron_to_hf(gather_full(pieces), self._hugging_face.config)
        self._hugging_face.load_state_dict(state, strict=True)
        self._stale = False

    # --- refit: NeMo-RL's calls -------------------------------------------------------------
    def prepare_refit_info(self) -> dict[str, Any]:
        """``{name: (shape, dtype)}`` of the weights a refit sends, Hugging Face names."""
        return {
            name: (tuple(tensor.shape), tensor.dtype)
            for name, tensor in self._hugging_face.state_dict().items()
        }

    def stream_weights_via_ipc_zmq(self, *args: Any, **kwargs: Any) -> list:
        """Colocated refit: the gathered weights, published to a vLLM engine (if any)."""
        model = self.model
        if self.weight_mailbox is None:
            return []
        return vllm_refit.publish(model, self.weight_mailbox)

    def broadcast_weights_for_collective(self, *args: Any, **kwargs: Any) -> list:
        """Non-colocated refit (NCCL on a GPU node): the same publication."""
        return self.stream_weights_via_ipc_zmq()

    # --- log-probabilities ------------------------------------------------------------------
    def get_logprobs(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        """``Policy.get_logprobs``: every rank runs the pass on its shard; the last pipeline
        stage's results of each data-parallel rank, in the batch's order."""
        reference = ray.put(data)
        results = ray.get([rank.logprobs.remote(reference) for rank in self.ranks])
        answers = {
            where["dp"]: result
            for where, result in zip(self.where, results, strict=True)
            if where["last"] and where["tp"] == 0 and where["cp"] == 0
        }
        logprobs = BatchedDataDict.from_batches(
            [BatchedDataDict(logprobs=answers[dp][0]) for dp in sorted(answers)]
        )
        unsorted = answers[0][1]
        if unsorted is not None:
            logprobs.reorder_data(unsorted)
        return logprobs

    # --- training ---------------------------------------------------------------------------
    def train(
        self,
        data: Any,
        loss_fn: Any,
        eval_mode: bool = False,
        *,
        gbs: int | None = None,
        mbs: int | None = None,
        timer: Any = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """``Policy.train``: every rank trains on its shard (megatron-core's schedule and
        Adam); the loss and gradient norm of rank 0, the micro-batch metrics of each
        data-parallel rank."""
        global_batch = gbs or self.cfg["train_global_batch_size"]
        micro_batch = mbs or self.cfg["train_micro_batch_size"]
        reference = ray.put(data)
        results = ray.get(
            [
                rank.train.remote(reference, loss_fn, eval_mode, global_batch, micro_batch)
                for rank in self.ranks
            ]
        )
        if not eval_mode:
            self._stale = True
            self.steps += data.size // global_batch
        # one result per data-parallel rank: the other ranks' are copies (NeMo-RL's worker
        # group returns those of the first rank of each replicated axis)
        results = [
            result
            for result, where in zip(results, self.where, strict=True)
            if where["tp"] == 0 and where["cp"] == 0 and where["pp"] == 0
        ]
        metrics: dict[str, list] = {}
        for result in results:
            for key, values in result["all_mb_metrics"].items():
                metrics.setdefault(key, []).extend(values)
        return {
            "loss": results[0]["global_loss"],
            "grad_norm": results[0]["grad_norm"],
            "all_mb_metrics": metrics,
        }

    # --- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(
        self,
        weights_path: str,
        optimizer_path: str | None = None,
        tokenizer_path: str | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """The gathered weights as a Hugging Face folder (with the tokenizer); each rank's
        optimizer state and the layout in ``optimizer_path``."""
        self.model.save_pretrained(weights_path)
        self.tokenizer.save_pretrained(weights_path)
        if optimizer_path is not None:
            folder = Path(optimizer_path)
            folder.mkdir(parents=True, exist_ok=True)
            ray.get([rank.save_optimizer.remote(str(folder)) for rank in self.ranks])
            record = {"layout": vars(self.layout), "steps": self.steps}
            (folder / LAYOUT_FILE).write_text(json.dumps(record))
        if tokenizer_path is not None:
            self.tokenizer.save_pretrained(tokenizer_path)

    def load_optimizer(self, optimizer_path: str | Path) -> None:
        """Each rank's optimizer state from a checkpoint of the same layout."""
        folder = Path(optimizer_path)
        record = json.loads((folder / LAYOUT_FILE).read_text())
        if Layout(**record["layout"]) != self.layout:
            raise MMPOInputError(
                f"the checkpoint's optimizer in {folder} was saved by the Megatron layout "
                f"{record['layout']}, this run has {vars(self.layout)}: resume with the same "
                "policy.megatron_cfg and cpu_backend.megatron_ranks, or start a new "
                "checkpointing.checkpoint_dir"
            )
        ray.get([rank.load_optimizer.remote(str(folder)) for rank in self.ranks])
        self.steps = int(record["steps"])

    def shutdown(self) -> bool:
        """The ranks leave their group and stop (a rank that cannot leave, after an error, is
        stopped all the same: this runs while the run's own error is being raised)."""
        try:
            ray.get([rank.leave.remote() for rank in self.ranks], timeout=60)
        except Exception:  # a dead or stuck rank: the kill below ends it
            pass
        for rank in self.ranks:
            ray.kill(rank)
        return True
