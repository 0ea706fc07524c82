"""Our losses through NeMo-RL's Megatron train step on real megatron-core, in parallel.

A tiny real megatron-core ``GPTModel`` (local layer spec, float32; ``nemo_mmpo/cpu/
megatron_model.py``) is trained one step, through NeMo-RL's own ``megatron_forward_backward``,
``LossPostProcessor``, ``process_global_batch`` and ``get_microbatch_iterator``, with megatron-
core's parallel state, schedules (1F1B under pipeline parallel), DDP and Adam, on gloo ranks of
this machine's CPU (``tests/megatron_ranks.py``), for ``loss_fn.name`` ``mmpo`` and ``dmpo`` and
NeMo-RL's ``ClippedPGLossFn``. Under TP=2, PP=2, CP=2 with packing, DP=2 (dynamic batching) and
TP=2 x PP=2 (4 ranks, packed), the reported loss, the log-probs (NeMo-RL's
``LogprobsPostProcessor`` path) and every parameter's gradient (the shards rebuilt into the
one-process model's tensors) equal the one-process step's; after the optimizer step the data-
and context-parallel replicas hold identical parameters. Transformer Engine's core attention
is stood in for where megatron-core needs it (context parallel, packed input):
``CPUCoreAttention`` in ``nemo_mmpo/cpu/megatron_cpu.py``, with the other CPU shims.

Tolerance: 1e-5 relative (values; gradients and log-probs in the Euclidean norm, per parameter
against the norm of the whole gradient). The model runs in float32 and each layout sums in
another order: matrix products split over tensor-parallel ranks, the vocabulary's log-sum-exp
split, attention over gathered keys, micro-batches of other sizes; float32's unit roundoff is
6e-8, and the model's forward and backward chain a few dozen such sums (relative errors of a
few 1e-7 were measured outside the project, 2026-11-24). The DP replica check is exact: the
all-reduced gradient buffers and the optimizer's arithmetic are identical on every replica.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from nemo_rl_support import import_nemo_rl, master_config_from_recipe, nemo_rl_checkout

pytestmark = pytest.mark.nemo_rl

pytest.importorskip(
    "megatron.core",
    reason="megatron-core is not installed (pip install "
    "megatron-core==0.19.2; scripts/nemo_rl_requirements.txt)",
)
import_nemo_rl("nemo_rl.algorithms.grpo")

from test_parallel_loss import (
    CONTROL,
    LOSSES,
    ONE_STEP,
    PACKED,
    UNPACKED,
    build_losses,
    logits_and_batch,
)

from nemo_mmpo.nemo_rl.dmpo_batch_terms import attach_penalty_terms

TESTS = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-5
VOCABULARY = 64  # the batch helper's tokens are below 64
MAX_LENGTH = 64
PP2 = ["policy.megatron_cfg.pipeline_model_parallel_size=2"]
TP2 = ["policy.megatron_cfg.tensor_model_parallel_size=2"]
CP2 = ["policy.megatron_cfg.context_parallel_size=2", "policy.make_sequence_length_divisible_by=4"]
LOGPROB_PACKED = ["++policy.sequence_packing.logprob_mb_tokens=48"]
DYNAMIC = [
    *UNPACKED,
    "policy.dynamic_batching.enabled=true",
    "policy.dynamic_batching.train_mb_tokens=48",
    "policy.dynamic_batching.logprob_mb_tokens=48",
    "policy.dynamic_batching.sequence_length_round=4",
]
REFERENCE = "one process"
# name: (tensor, pipeline, context, data, overrides)
LAYOUTS = {
    REFERENCE: (1, 1, 1, 1, [*UNPACKED, "policy.train_micro_batch_size=8"]),
    "tp2": (2, 1, 1, 1, [*TP2, *UNPACKED, "policy.train_micro_batch_size=2"]),
    "pp2": (1, 2, 1, 1, [*PP2, *UNPACKED, "policy.train_micro_batch_size=2"]),
    "cp2+packing": (1, 1, 2, 1, [*CP2, *PACKED, *LOGPROB_PACKED]),
    "dp2": (1, 1, 1, 2, DYNAMIC),
    "tp2xpp2": (2, 2, 1, 1, [*TP2, *PP2, *PACKED, *LOGPROB_PACKED]),
}
PARALLEL = [name for name in LAYOUTS if name != REFERENCE]


def snapshot_name() -> str:
    return nemo_rl_checkout().name.removeprefix("nemo-rl-")


def layout_spec(name: str) -> dict:
    tensor, pipeline, context, data, overrides = LAYOUTS[name]
    policy = master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml", [*ONE_STEP, *overrides]).policy
    return {
        "name": name,
        "tensor": tensor,
        "pipeline": pipeline,
        "context": context,
        "data": data,
        "policy": policy,
    }


def world(name: str) -> int:
    tensor, pipeline, context, data, _ = LAYOUTS[name]
    return tensor * pipeline * context * data


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every layout's log-probs and steps from ``tests/megatron_ranks.py``: one launch of 1 rank
    (the one-process step, whose seeded weights the others load), one of 2, one of 4."""
    losses, dmpo_settings = build_losses()
    _, data = logits_and_batch()
    dmpo_data = data.select_indices(list(range(data.size)))
    attach_penalty_terms(dmpo_data, dmpo_settings)  # what grpo_train does for dmpo
    launches = [
        {
            "index": index,
            "world": size,
            "layouts": [layout_spec(name) for name in LAYOUTS if world(name) == size],
        }
        for index, size in enumerate((1, 2, 4))
    ]
    spec = {
        "vocabulary": VOCABULARY,
        "max_length": MAX_LENGTH,
        "logprob_data": data,
        "losses": {
            name: (loss_fn, dmpo_data if name == "dmpo" else data)
            for name, loss_fn in losses.items()
        },
        "launches": launches,
    }
    folder = tmp_path_factory.mktemp("megatron_parallel")
    torch.save(spec, folder / "spec.pt")
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join([str(TESTS), environment.get("PYTHONPATH", "")])
    started = time.monotonic()
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "from megatron_ranks import main; main()",
            str(folder / "spec.pt"),
            str(folder),
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    )
    seconds = time.monotonic() - started
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-8000:]
    results = {}
    for launch in launches:
        results.update(torch.load(folder / f"launch-{launch['index']}.pt", weights_only=False))
    return {"results": results, "seconds": seconds, "data": data}


@pytest.fixture(scope="module")
def report(request):
    """One line per comparison for the CI log, printed once the module's tests are done."""
    lines = []
    yield lines
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        sys.stdout.write("\n" + "\n".join(lines) + "\n")


def gradient_gap(result: dict, reference: dict) -> float:
    """Largest relative difference of one parameter's gradient, against the whole gradient's
    norm (a parameter's gradient can be near zero)."""
    whole = torch.sqrt(sum(g.double().pow(2).sum() for g in reference["grad"].values()))
    assert set(result["grad"]) == set(reference["grad"])
    return max(
        float((result["grad"][name] - g).double().norm() / whole)
        for name, g in reference["grad"].items()
    )


def logprob_gap(logprobs: torch.Tensor, reference: torch.Tensor, data) -> float:
    """Relative difference (Euclidean norm) of the ``[batch, seq_len]`` log-probs at each row's
    tokens after the first (the rest is padding, where only the unpacked path computes any)."""
    positions = torch.arange(reference.shape[1])
    tokens = (positions >= 1) & (positions < data["input_lengths"][:, None])
    return float((logprobs - reference)[tokens].norm() / reference[tokens].norm())


@pytest.mark.parametrize("layout", PARALLEL)
def test_parallel_step_matches_one_process(outcomes, report, layout):
    results = outcomes["results"]
    mine, reference = results[layout], results[REFERENCE]
    logprobs = logprob_gap(mine["logprobs"], reference["logprobs"], outcomes["data"])
    lines, failed = [f"logprobs rel {logprobs:.1e}"], logprobs > TOLERANCE
    for loss in LOSSES:
        step, one = mine["steps"][loss], reference["steps"][loss]
        value = abs(step["loss"] - one["loss"]) / abs(one["loss"])
        gradient = gradient_gap(step, one)
        failed |= value > TOLERANCE or gradient > TOLERANCE or not step["stepped"]
        lines.append(f"{loss}: loss rel {value:.1e}, grad rel {gradient:.1e}")
    verdict = "FAILED" if failed else "ok"
    report.append(f"megatron-core {snapshot_name()} {layout}: {'; '.join(lines)}: {verdict}")
    assert not failed, lines


@pytest.mark.parametrize("layout", ["cp2+packing", "dp2"])
def test_replicas_stay_identical_after_the_optimizer_step(outcomes, report, layout):
    """megatron-core's DDP all-reduces the gradient buffers over data and context parallel, so
    every replica holds the same gradients and steps to the same parameters: exactly."""
    steps = outcomes["results"][layout]["steps"]
    gaps = {loss: steps[loss]["replica_gap"] for loss in LOSSES}
    report.append(f"megatron-core {snapshot_name()} {layout} replicas after Adam: {gaps}")
    for loss in LOSSES:
        assert gaps[loss] == {"grad": 0.0, "param": 0.0}, (loss, gaps[loss])


def test_the_comparisons_are_not_vacuous(outcomes, report):
    """MMPO's loss is NeMo-RL's (equal to the control); DMPO's penalty moves the gradient far
    beyond the tolerance, so matching the one-process DMPO step means its terms reached every
    rank's loss."""
    results = outcomes["results"]
    report.append(
        f"megatron-core {snapshot_name()}: {len(results)} layouts x {len(LOSSES)} losses on 1, "
        f"2 and 4 gloo ranks in {outcomes['seconds']:.0f} s"
    )
    for layout in LAYOUTS:
        steps = results[layout]["steps"]
        assert steps["mmpo"]["loss"] == steps[CONTROL]["loss"]
        assert gradient_gap(steps["dmpo"], steps[CONTROL]) > 100 * TOLERANCE
