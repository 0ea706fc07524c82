"""NeMo-RL's Megatron train step on a real megatron-core ``GPTModel``, on gloo ranks.

``tests/nemo_rl_adapter/test_parallel_loss.py`` writes a spec (``torch.save``) and runs
:func:`main` in a fresh interpreter: ``python -c "from parallel_loss_ranks import main; main()"
SPEC OUT``. That process installs the CPU shims (:mod:`nemo_mmpo.cpu.answers.megatron_cpu`), imports
megatron-core and NeMo-RL once, then for each launch forks ``world`` ranks that meet over gloo on
127.0.0.1. For each layout (tensor x pipeline x context x data = world), every rank runs
megatron-core's ``initialize_model_parallel``, builds its part of the tiny ``GPTModel``
(:mod:`nemo_mmpo.cpu.engines.megatron_model`) from the same one-process weights, and does what
NeMo-RL's ``Policy`` and ``MegatronPolicyWorker`` do (:mod:`nemo_mmpo.cpu.engines.megatron_step`):

- ``get_logprobs``: ``Policy._shard_for_logprob``, ``get_microbatch_iterator``,
  ``LogprobsPostProcessor`` through ``megatron_forward_backward`` (forward only), the shards put
  back in order (``BatchedDataDict.from_batches``, ``reorder_data``);
- ``train`` (one global batch, per loss): ``Policy._shard_for_train``, ``zero_grad_buffer``,
  ``process_global_batch``, ``get_microbatch_iterator``, ``LossPostProcessor`` through
  ``megatron_forward_backward`` (megatron-core's schedule; its ``finalize_model_grads``
  all-reduces the DDP gradient buffers), ``aggregate_training_statistics``, then megatron-core's
  Adam ``optimizer.step()``.

Rank 0 writes ``OUT/launch-<i>.pt``: per layout the log-probs ``[batch, seq_len]``; per layout and
loss the reported ``loss``, what each rank's model was given per micro-batch (the places of its
tokens, :data:`PLACE_KEY`), the full parameter gradients by one-process name (rebuilt from the
tensor- and pipeline-parallel shards of data/context replica 0), the largest difference between
data/context replicas' gradients and, after the step, their parameters.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from gloo_ranks import run_launch

from nemo_mmpo.cpu.answers import megatron_cpu

SEED = 1234
#: Where the batch carries each token's place in the whole batch (``row * seq_len + pos + 1``;
#: 0 is padding). NeMo-RL packs this key as it packs the tokens and hands it to the model as
#: ``loss_mask`` (for Multi-Token Prediction, which the tiny model has not: it reads nothing
#: from it); a hook on the model records, per micro-batch, which places each rank was given.
PLACE_KEY = "mtp_loss_mask"


def token_places(input_ids: torch.Tensor) -> torch.Tensor:
    """``[batch, seq_len]`` each token's place in the flattened batch, plus one."""
    return torch.arange(1, input_ids.numel() + 1).reshape(input_ids.shape)


def coordinates() -> dict[str, Any]:
    from megatron.core import parallel_state as ps

    return {
        "tp": ps.get_tensor_model_parallel_rank(),
        "pp": ps.get_pipeline_model_parallel_rank(),
        "cp": ps.get_context_parallel_rank(),
        "dp": ps.get_data_parallel_rank(),
        "last": ps.is_pipeline_last_stage(),
    }


def build(layout: dict, spec: dict, weights: dict | None) -> Any:
    """This rank's part of the tiny model, with the one-process ``weights`` (None: seeded with
    :data:`SEED`)."""
    from nemo_mmpo.cpu.engines.megatron_model import load_full, tiny_gpt

    megatron_cpu.cpu_rng_tracker(SEED)
    model = tiny_gpt(spec["vocabulary"], spec["max_length"])
    if weights is not None:
        load_full(model, weights)
    return model


def get_logprobs(model: Any, cfg: dict, data: Any) -> Any:
    """``Policy.get_logprobs`` + ``MegatronPolicyWorker.get_logprobs`` on this rank
    (:func:`nemo_mmpo.cpu.engines.megatron_step.logprobs`)."""
    from nemo_mmpo.cpu.engines import megatron_step

    return megatron_step.logprobs(model, cfg, data)


def record_calls(model: Any) -> list[dict[str, Any]]:
    """Per forward call of the model on this rank: the input's shape, whether it was packed, the
    places (:data:`PLACE_KEY`) of its tokens."""
    calls: list[dict[str, Any]] = []

    def hook(module: Any, args: tuple, kwargs: dict) -> None:
        places = kwargs["loss_mask"].long()
        calls.append(
            {
                "shape": tuple(kwargs["input_ids"].shape),
                "packed": kwargs.get("packed_seq_params") is not None,
                "places": sorted(places[places > 0].tolist()),
            }
        )

    model.module.register_forward_pre_hook(hook, with_kwargs=True)
    return calls


def train(model: Any, cfg: dict, loss_fn: Any, train_data: Any) -> dict[str, Any]:
    """One ``Policy.train`` step (one global batch) and megatron-core's Adam step
    (:func:`nemo_mmpo.cpu.engines.megatron_step.train_step`), recording what the model was given and
    the reduced gradients before the step."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from nemo_mmpo.cpu.engines import megatron_step
    from nemo_mmpo.cpu.engines.megatron_model import local_pieces

    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-2, clip_grad=1.0, params_dtype=torch.float32),
        [model],
    )
    calls = record_calls(model)
    gradients: dict[str, Any] = {}
    step = megatron_step.train_step(
        model,
        optimizer,
        cfg,
        loss_fn,
        train_data,
        before_optimizer_step=lambda: gradients.update(local_pieces(model, "grad")),
    )
    return {
        "loss": step["loss"],
        "calls": calls,
        "grad": gradients,
        "param": local_pieces(model, "param"),
        "stepped": step["stepped"],
    }


def run_layout(layout: dict, spec: dict, weights: dict | None, out: Path) -> dict:
    """Every loss's step and the log-probs under ``layout``; rank 0 gets them all."""
    from megatron.core import parallel_state as ps

    ps.initialize_model_parallel(
        tensor_model_parallel_size=layout["tensor"],
        pipeline_model_parallel_size=layout["pipeline"],
        context_parallel_size=layout["context"],
    )
    try:
        here = coordinates()
        model = build(layout, spec, weights)
        logprobs, unsorted = get_logprobs(model, layout["policy"], spec["batch"])
        rank_results = {"where": here, "logprobs": logprobs, "unsorted": unsorted, "steps": {}}
        for loss_name, (loss_fn, train_data) in spec["losses"].items():
            model = build(layout, spec, weights)
            try:
                step = train(model, layout["policy"], loss_fn, train_data)
            except Exception as error:
                if not layout.get("may_fail"):
                    raise
                frames = traceback.extract_tb(error.__traceback__)
                step = {
                    "error": f"{type(error).__name__}: {error}",
                    "raised_in": [(Path(f.filename).name, f.name) for f in frames],
                }
            rank_results["steps"][loss_name] = step
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, rank_results)
        return combine(everyone, spec) if dist.get_rank() == 0 else {}
    finally:
        ps.destroy_model_parallel()


def combine(ranks: list[dict], spec: dict) -> dict:
    """Rank 0: the layout's log-probs, and per loss the loss, full gradients, replica gaps."""
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    from nemo_mmpo.cpu.engines.megatron_model import gather_full

    def is_replica_zero(where: dict) -> bool:
        return where["dp"] == 0 and where["cp"] == 0

    last = {
        r["where"]["dp"]: r
        for r in ranks
        if r["where"]["last"] and r["where"]["tp"] == 0 and r["where"]["cp"] == 0
    }
    logprobs = BatchedDataDict.from_batches(
        [BatchedDataDict(logprobs=last[dp]["logprobs"]) for dp in sorted(last)]
    )
    if last[0]["unsorted"] is not None:
        logprobs.reorder_data(last[0]["unsorted"])
    combined: dict[str, Any] = {"logprobs": logprobs["logprobs"], "steps": {}}
    for loss_name in spec["losses"]:
        steps = [(r["where"], r["steps"][loss_name]) for r in ranks]
        if "error" in steps[0][1]:  # a layout that may fail did (one rank)
            combined["steps"][loss_name] = steps[0][1]
            continue
        loss = next(step["loss"] for where, step in steps if where["last"])
        grads = gather_full([step["grad"] for where, step in steps if is_replica_zero(where)])
        gaps = {}
        for which in ("grad", "param"):
            gap = 0.0
            for where, step in steps:
                twin = next(
                    s
                    for w, s in steps
                    if is_replica_zero(w) and (w["tp"], w["pp"]) == (where["tp"], where["pp"])
                )
                for name, (tensor, _, _) in step[which].items():
                    gap = max(gap, float((tensor - twin[which][name][0]).abs().max()))
            gaps[which] = gap
        params = gather_full([step["param"] for where, step in steps if is_replica_zero(where)])
        combined["steps"][loss_name] = {
            "loss": loss,
            "grad": grads,
            "param": params,
            "replica_gap": gaps,
            "stepped": all(step["stepped"] for _, step in steps),
            "calls_per_rank": [step["calls"] for _, step in steps],
        }
    return combined


def prepare_rank(rank: int, world: int, launch: dict, spec: dict, out: Path) -> None:
    """One rank: the seeded one-process model's weights (every layout's) and log-probs."""
    from megatron.core import parallel_state as ps

    from nemo_mmpo.cpu.engines.megatron_model import local_pieces

    ps.initialize_model_parallel()
    (layout,) = launch["layouts"]
    model = build(layout, spec, None)
    weights = {name: tensor for name, (tensor, _, _) in local_pieces(model, "param").items()}
    logprobs, _ = get_logprobs(model, layout["policy"], spec["batch"])
    torch.save({"weights": weights, "logprobs": logprobs}, out / "prepared.pt")
    ps.destroy_model_parallel()


def training_data(spec: dict, logprobs: torch.Tensor) -> dict[str, tuple[Any, Any]]:
    """Per loss: the loss function and its ``train_data``: ``spec['batch']`` with
    ``prev_logprobs`` the model's own log-probs plus ``spec['prev_noise']`` (as at a later
    optimizer step: some ratios are clipped, on both sides), and for ``dmpo`` the penalty's
    batch terms (what ``grpo_train`` attaches)."""
    from nemo_mmpo.nemo_rl.dmpo_batch_terms import attach_penalty_terms

    data = spec["batch"].select_indices(list(range(spec["batch"].size)))
    mask = data["token_mask"].to(logprobs.dtype)
    prev = torch.zeros_like(data["prev_logprobs"])
    prev[:, 1:] = ((logprobs[:, 1:] + spec["prev_noise"][:, 1:]) * mask[:, 1:]).to(prev.dtype)
    data["prev_logprobs"] = prev
    data["generation_logprobs"] = prev.clone()
    losses = {}
    for name, loss_fn in spec["losses"].items():
        if name == "dmpo":
            dmpo_data = data.select_indices(list(range(data.size)))
            attach_penalty_terms(dmpo_data, spec["dmpo_settings"])
            losses[name] = (loss_fn, dmpo_data)
        else:
            losses[name] = (loss_fn, data)
    return losses


def run_rank(rank: int, world: int, launch: dict, spec: dict, out: Path) -> None:
    weights = torch.load(out / "prepared.pt")["weights"]
    results = {}
    for layout in launch["layouts"]:
        results[layout["name"]] = run_layout(layout, spec, weights, out)
    if rank == 0:
        torch.save(results, out / f"launch-{launch['index']}.pt")


def main() -> None:
    spec_path, out = Path(sys.argv[1]), Path(sys.argv[2])
    torch.set_num_threads(1)  # ranks share two cores; and fork before any thread pool starts
    megatron_cpu.install()
    # import megatron-core and NeMo-RL once, before forking: the ranks inherit them
    import nemo_rl.models.megatron.data
    import nemo_rl.models.megatron.train
    import nemo_rl.models.policy.lm_policy  # noqa: F401

    import nemo_mmpo.cpu.engines.megatron_model
    import nemo_mmpo.cpu.engines.megatron_step  # noqa: F401

    spec = torch.load(spec_path, weights_only=False)
    reference = spec["launches"][0]["layouts"][0]
    run_launch({"index": "prepare", "world": 1, "layouts": [reference]}, spec, out, prepare_rank)
    spec["losses"] = training_data(spec, torch.load(out / "prepared.pt")["logprobs"])
    for launch in spec["launches"]:
        run_launch(launch, spec, out, run_rank)
