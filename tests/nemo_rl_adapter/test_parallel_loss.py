"""Our losses through NeMo-RL's Megatron train step on real megatron-core, in parallel.

A tiny real megatron-core ``GPTModel`` (local layer spec, float32; ``nemo_mmpo/cpu/
megatron_model.py``) takes one training step through NeMo-RL's own ``megatron_forward_backward``,
``LossPostProcessor`` (its packing wrappers, ``DistributedLogprob``, the context-parallel
all-gather), ``process_global_batch``, ``get_microbatch_iterator`` and ``Policy``'s sharding,
with megatron-core's parallel state, schedules (1F1B under pipeline parallel), DDP and Adam, on
gloo ranks of this machine's CPU (``tests/parallel_loss_ranks.py``), for ``loss_fn.name``
``mmpo`` and ``dmpo`` (built as NeMo-RL's ``setup()`` builds them after ``install()``) and
NeMo-RL's own ``ClippedPGLossFn`` (the control). Under TP=2, PP=2, CP=2 with packing, DP=2
(dynamic batching), TP=2 x PP=2 (packed) and the 4-rank products TP=2 x DP=2 (fused packed loss),
CP=2 x DP=2 and TP=2 x CP=2 (fused), the reported loss, the log-probs (NeMo-RL's
``LogprobsPostProcessor`` path, ``Policy``'s re-ordering) and every parameter's gradient (the
shards rebuilt into the one-process model's tensors) equal the one-process step's; after Adam's
step the data- and context-parallel replicas hold identical parameters. Only Transformer
Engine's core attention is stood in for, where megatron-core needs it (context parallel, packed
input): ``CPUCoreAttention`` in ``nemo_mmpo/cpu/answers/megatron_cpu.py``, with the CPU shims.

Tolerance: 1e-5 relative (the loss; log-probs and each parameter's gradient in the Euclidean
norm, against the whole log-probs' and gradient's norms). The model runs in float32 and each
layout sums in another order: matrix products split over tensor-parallel ranks, the
vocabulary's log-sum-exp split, attention over gathered keys, micro-batches of other sizes.
float32's unit roundoff is 6e-8 and forward and backward chain a few dozen such sums: measured
here at most 2.2e-7 (``scripts/test_nemo_rl.sh`` prints each layout's). The replica check is
exact: every replica holds the same all-reduced gradient buffers and does the same arithmetic.

The module also reproduces NeMo-RL v0.7.0's crash in its fused packed loss
(``policy.sequence_packing.fuse_loss: true``) when the packer pads a packed row past the
unpacked rows (pipeline parallel, FP8): ``_pack_input_ids`` copies the padded length out of the
row. ``--dry-run`` refuses those settings on a checkout with that code
(``nemo_mmpo/launch/rules.py``, ``fused_sequence_packing``).
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

grpo = import_nemo_rl("nemo_rl.algorithms.grpo")
loss_module = import_nemo_rl("nemo_rl.algorithms.loss")
import_nemo_rl("megatron.core")  # scripts/nemo_rl_requirements.txt pins megatron-core

from parallel_loss_ranks import PLACE_KEY, token_places
from test_dmpo_nemo_rl import training_batch

from nemo_mmpo import compute_advantages
from nemo_mmpo.nemo_rl import install
from nemo_mmpo.nemo_rl.dmpo_batch_terms import read_dmpo_settings
from nemo_mmpo.nemo_rl.loss import DMPOLossFn, MMPOClippedPGLossFn
from nemo_mmpo.nemo_rl.versions import fused_packing_overruns_rows

TESTS = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-5
VOCABULARY = 64  # the batch helper's tokens are below 60
MAX_LENGTH = 64
CONTROL = "clipped_pg"
LOSSES = ("mmpo", "dmpo", CONTROL)

# NeMo-RL's policy settings for each layout, as recipe overrides (data parallel is what the
# ranks leave). One global batch: one optimizer step.
ONE_STEP = ["policy.train_global_batch_size=8"]
UNPACKED = ["policy.sequence_packing.enabled=false"]
PACKED = [
    "policy.sequence_packing.enabled=true",
    "policy.sequence_packing.train_mb_tokens=48",
    "++policy.sequence_packing.logprob_mb_tokens=48",
]
FUSED = [*PACKED, "++policy.sequence_packing.fuse_loss=true"]
TP2 = ["policy.megatron_cfg.tensor_model_parallel_size=2"]
PP2 = ["policy.megatron_cfg.pipeline_model_parallel_size=2"]
CP2 = ["policy.megatron_cfg.context_parallel_size=2", "policy.make_sequence_length_divisible_by=4"]
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
    "cp2+packing": (1, 1, 2, 1, [*CP2, *PACKED]),
    "dp2": (1, 1, 1, 2, DYNAMIC),
    "tp2xpp2": (2, 2, 1, 1, [*TP2, *PP2, *PACKED]),
    "tp2xdp2": (2, 1, 1, 2, [*TP2, *FUSED]),
    "cp2xdp2": (1, 1, 2, 2, [*CP2, *PACKED]),
    "tp2xcp2": (2, 1, 2, 1, [*TP2, *CP2, *FUSED]),
}
PARALLEL = [name for name in LAYOUTS if name != REFERENCE]
# The packer pads each packed row to the longest micro-batch's (pipeline parallel) or to a
# multiple of 128 tokens (blockwise FP8) and the last sequence absorbs the padding. One process:
# the settings reach the packer; the model is the one-process one.
BIN_PADDING = {
    "pp2 fused": (1, 1, 1, 1, [*FUSED, *PP2]),
    "fp8 fused": (1, 1, 1, 1, [*FUSED, "policy.megatron_cfg.fp8_cfg.enabled=true"]),
    "pp2 unfused": (1, 1, 1, 1, [*PACKED, *PP2]),
}


def snapshot_name() -> str:
    return nemo_rl_checkout().name.removeprefix("nemo-rl-")


def build_losses():
    """The three losses as NeMo-RL's ``setup()`` builds them (after ``install()``)."""
    install()
    mmpo = master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml")
    dmpo = master_config_from_recipe("dmpo_math_qwen3_1.7b.yaml")
    losses = {
        "mmpo": grpo.ClippedPGLossFn(mmpo.loss_fn),
        "dmpo": grpo.ClippedPGLossFn(dmpo.loss_fn),
        CONTROL: loss_module.ClippedPGLossFn(mmpo.loss_fn),
    }
    assert type(losses["mmpo"]) is MMPOClippedPGLossFn and isinstance(losses["dmpo"], DMPOLossFn)
    assert type(losses[CONTROL]) is loss_module.ClippedPGLossFn
    return losses, read_dmpo_settings(dmpo.loss_fn)


def batch_and_noise():
    """NeMo-RL's ``train_data`` ``[8, width]``: two prompt groups of four, mixed rewards, one
    sample filtered, rows padded as ``grpo_train`` pads them; and the noise ``[8, width]`` the
    ranks add to the model's own log-probs to make ``prev_logprobs``
    (``parallel_loss_ranks.training_data``)."""
    generator = torch.Generator().manual_seed(19)
    groups = torch.tensor([0, 1, 0, 1, 1, 0, 0, 1])
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    advantages = compute_advantages(rewards, groups, None, "grpo")
    data = training_batch(advantages, groups, generator, max_response=20)
    data["sample_mask"][5] = 0.0
    # grpo_train pads the rows to policy.make_sequence_length_divisible_by (4 at most here)
    width = -(-data["input_ids"].shape[1] // 4) * 4
    for key, value in data.items():
        if torch.is_tensor(value) and value.dim() == 2:
            data[key] = torch.nn.functional.pad(value, (0, width - value.shape[1]))
    noise = 0.3 * torch.randn(data["input_ids"].shape, generator=generator, dtype=torch.float64)
    data[PLACE_KEY] = token_places(data["input_ids"])
    assert int(data["input_lengths"].max()) <= 24
    return data, noise


def layout_spec(name: str, layout: tuple, may_fail: bool = False) -> dict:
    tensor, pipeline, context, data, overrides = layout
    policy = master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml", [*ONE_STEP, *overrides]).policy
    return {
        "name": name,
        "tensor": tensor,
        "pipeline": pipeline,
        "context": context,
        "data": data,
        "policy": policy,
        "may_fail": may_fail,
    }


def world(layout: tuple) -> int:
    tensor, pipeline, context, data, _ = layout
    return tensor * pipeline * context * data


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every layout's log-probs and steps from ``tests/parallel_loss_ranks.py``: launches of 1
    rank (the one-process step, whose seeded weights every layout loads, and the bin-padding
    cases), 2 and 4 ranks."""
    losses, dmpo_settings = build_losses()
    data, noise = batch_and_noise()
    launches = [
        {
            "index": index,
            "world": size,
            "layouts": [
                layout_spec(name, LAYOUTS[name]) for name in LAYOUTS if world(LAYOUTS[name]) == size
            ]
            + (
                [layout_spec(name, case, True) for name, case in BIN_PADDING.items()]
                if size == 1
                else []
            ),
        }
        for index, size in enumerate((1, 2, 4))
    ]
    spec = {
        "vocabulary": VOCABULARY,
        "max_length": MAX_LENGTH,
        "batch": data,
        "prev_noise": noise,
        "losses": losses,
        "dmpo_settings": dmpo_settings,
        "launches": launches,
    }
    folder = tmp_path_factory.mktemp("parallel_loss")
    torch.save(spec, folder / "spec.pt")
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join([str(TESTS), environment.get("PYTHONPATH", "")])
    started = time.monotonic()
    command = "from parallel_loss_ranks import main; main()"
    run = subprocess.run(
        [sys.executable, "-c", command, str(folder / "spec.pt"), str(folder)],
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
    """One line per comparison for the CI log, printed together once the module's tests are
    done (whatever pytest's ``-q``/``-r`` options), failures included."""
    lines = []
    yield lines
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        sys.stdout.write("\n" + "\n".join(lines) + "\n")


def gradient_gap(result: dict, reference: dict) -> float:
    """Largest difference of one parameter's gradient, relative to the whole gradient's norm
    (a parameter's own gradient can be near zero)."""
    whole = torch.sqrt(sum(g.double().pow(2).sum() for g in reference["grad"].values()))
    assert set(result["grad"]) == set(reference["grad"])
    return max(
        float((result["grad"][name] - g).double().norm() / whole)
        for name, g in reference["grad"].items()
    )


def logprob_gap(logprobs: torch.Tensor, reference: torch.Tensor, data) -> float:
    """Relative difference (Euclidean norm) of ``[batch, seq_len]`` log-probs at each row's
    tokens after the first (the rest is padding, where only the unpacked path computes any)."""
    positions = torch.arange(reference.shape[1])
    tokens = (positions >= 1) & (positions < data["input_lengths"][:, None])
    return float((logprobs - reference)[tokens].norm() / reference[tokens].norm())


def compared(step: dict, one: dict) -> tuple[bool, str]:
    """Whether a step's loss and gradients equal the one-process step's, and a line saying so."""
    value = abs(step["loss"] - one["loss"]) / abs(one["loss"])
    gradient = gradient_gap(step, one)
    agree = value <= TOLERANCE and gradient <= TOLERANCE and step["stepped"]
    return agree, f"loss rel {value:.1e}, grad rel {gradient:.1e}"


@pytest.mark.parametrize("layout", PARALLEL)
def test_parallel_step_matches_one_process(outcomes, report, layout):
    mine, reference = outcomes["results"][layout], outcomes["results"][REFERENCE]
    logprobs = logprob_gap(mine["logprobs"], reference["logprobs"], outcomes["data"])
    lines, agree = [f"logprobs rel {logprobs:.1e}"], logprobs <= TOLERANCE
    for loss in LOSSES:
        ok, line = compared(mine["steps"][loss], reference["steps"][loss])
        agree &= ok
        lines.append(f"{loss} {line}")
    verdict = "ok" if agree else "FAILED"
    report.append(f"parallel-loss {snapshot_name()} {layout}: {'; '.join(lines)}: {verdict}")
    assert agree, lines


@pytest.mark.parametrize("layout", ["cp2+packing", "dp2", "tp2xdp2", "cp2xdp2"])
def test_replicas_stay_identical_after_the_optimizer_step(outcomes, report, layout):
    """megatron-core's DDP all-reduces the gradient buffers over data and context parallel, so
    every replica holds the same gradients and Adam steps them to the same parameters: exactly."""
    steps = outcomes["results"][layout]["steps"]
    gaps = {loss: steps[loss]["replica_gap"] for loss in LOSSES}
    worst = max(max(gap.values()) for gap in gaps.values())
    line = f"largest difference between replicas' gradients and stepped parameters {worst:.1e}"
    report.append(f"parallel-loss {snapshot_name()} {layout} after Adam: {line}")
    for loss in LOSSES:
        assert gaps[loss] == {"grad": 0.0, "param": 0.0}, (loss, gaps[loss])


def test_the_comparisons_are_not_vacuous(outcomes):
    """MMPO's loss is NeMo-RL's, so equal to the control in every layout; DMPO's penalty moves
    the gradient far beyond the tolerance, so matching the one-process DMPO step means the
    penalty's terms reached every rank's loss; the step moved the parameters."""
    results = outcomes["results"]
    for layout in LAYOUTS:
        steps = results[layout]["steps"]
        assert steps["mmpo"]["loss"] == steps[CONTROL]["loss"]
        assert gradient_gap(steps["mmpo"], steps[CONTROL]) == 0.0
        assert gradient_gap(steps["dmpo"], steps[CONTROL]) > 100 * TOLERANCE
    one = results[REFERENCE]["steps"][CONTROL]
    moved = [name for name in one["grad"] if one["grad"][name].abs().max() > 0]
    assert len(moved) == len(one["grad"])  # every parameter has a gradient


def test_the_layouts_split_the_batch_as_configured(outcomes, report):
    """Each layout ran on the ranks and with the micro-batches its settings ask for, so the
    comparisons cover tensor, pipeline, context and data parallel, micro-batches, dynamic
    batching, and packing fused and per sequence: not one path eight times."""
    results = outcomes["results"]
    report.append(
        f"parallel-loss {snapshot_name()}: {len(results)} layouts x {len(LOSSES)} losses on 1, 2 "
        f"and 4 gloo ranks in {outcomes['seconds']:.0f} s"
    )

    def calls(layout):  # per rank, per micro-batch: what the model was given
        return results[layout]["steps"][CONTROL]["calls_per_rank"]

    def tokens(layout, rank):  # the places in the batch of the tokens a rank saw
        return {place for call in calls(layout)[rank] for place in call["places"]}

    data = outcomes["data"]
    width = data["input_ids"].shape[1]
    every_token = {
        row * width + position + 1
        for row, length in enumerate(data["input_lengths"].tolist())
        for position in range(length)
    }
    ((whole,),) = calls(REFERENCE)
    assert whole["shape"] == (8, width) and not whole["packed"]
    assert [len(rank) for rank in calls("tp2")] == [4, 4]  # micro-batches of 2, on both ranks
    assert tokens("tp2", 0) == tokens("tp2", 1)  # each its vocabulary shard of every token
    dynamic = [call for rank in calls("dp2") for call in rank]
    assert len({call["shape"][1] for call in dynamic}) > 1  # widths cut per micro-batch
    assert not any(call["packed"] for rank in calls("tp2") for call in rank) and not any(
        call["packed"] for call in dynamic
    )
    for layout in ("cp2+packing", "tp2xpp2", "tp2xdp2", "cp2xdp2", "tp2xcp2"):
        assert all(call["packed"] and call["shape"][0] == 1 for r in calls(layout) for call in r)
    # rank = tensor + 2 x (context or data): context and data ranks split the tokens, tensor
    # ranks share them
    for layout, splits, shares in (
        ("cp2+packing", [(0, 1)], []),
        ("pp2", [], [(0, 1)]),
        ("tp2xpp2", [], [(0, 1), (2, 3), (0, 2)]),
        ("dp2", [(0, 1)], []),
        ("tp2xdp2", [(0, 2), (1, 3)], [(0, 1), (2, 3)]),
        ("cp2xdp2", [(0, 1, 2, 3)], []),
        ("tp2xcp2", [(0, 2), (1, 3)], [(0, 1), (2, 3)]),
    ):
        for ranks in splits:
            seen = [tokens(layout, rank) for rank in ranks]
            assert set().union(*seen) >= every_token, layout  # every real token
            assert sum(map(len, seen)) == len(set().union(*seen)), layout  # once
        for first, second in shares:
            assert tokens(layout, first) == tokens(layout, second), layout


@pytest.mark.parametrize("case", list(BIN_PADDING))
def test_fused_packing_with_padded_rows(outcomes, report, case):
    """NeMo-RL v0.7.0's fused packed loss crashes in ``_pack_input_ids`` when the packer pads a
    packed row into its last sequence past the batch's rows (pipeline parallel, FP8); main
    clamps the copy and computes the one-process step. The per-sequence wrapper computes it on
    both (the fix ``--dry-run`` names). ``fused_packing_overruns_rows``, the marker the
    ``--dry-run`` rule reads, must say which."""
    root = nemo_rl_checkout()
    crashes = "unfused" not in case and fused_packing_overruns_rows(root)
    results = outcomes["results"]
    for loss in LOSSES:
        result = results[case]["steps"][loss]
        if crashes:
            error = result.get("error", "no error").split(" at non-singleton")[0]
            line = f"crashes in _pack_input_ids as expected ({error})"
            report.append(f"parallel-loss {snapshot_name()} {loss} {case}: {line}")
            assert "error" in result, f"{case} {loss} did not crash"
            assert ("utils.py", "_pack_input_ids") in result["raised_in"]
            assert "must match the existing size" in result["error"]
        elif "error" in result:
            report.append(f"parallel-loss {snapshot_name()} {loss} {case}: {result['error']}")
            raise AssertionError(f"{case} {loss}: {result['error']}")
        else:
            agree, line = compared(result, results[REFERENCE]["steps"][loss])
            report.append(f"parallel-loss {snapshot_name()} {loss} {case}: {line}")
            assert agree, line
    if import_nemo_rl("nemo_rl").__version__ == "0.7.0":
        assert fused_packing_overruns_rows(root)
