"""Our losses through NeMo-RL's Megatron training step under tensor, context and data parallel.

For ``loss_fn.name`` ``mmpo`` and ``dmpo`` (built as NeMo-RL's ``setup()`` builds them after
``install()``) and NeMo-RL's own ``ClippedPGLossFn`` (the control), one optimizer step's
reported ``loss`` and the gradient of what it back-propagates with respect to the whole batch's
logits are compared between one process and tensor parallel 2, context parallel 2 with sequence
packing, data parallel 2 and their 4-process products. The step is NeMo-RL's own data path
(``tests/parallel_loss_ranks.py``: ``Policy._shard_for_train``, ``process_global_batch``,
``get_microbatch_iterator``, ``LossPostProcessor`` and its packing wrappers,
``DistributedLogprob``, the context-parallel all-gather) on gloo ranks on this machine's CPU;
only the model and Megatron-core are stood in for (``tests/megatron_standins.py``).

Tolerance: 1e-6 relative (the value; the gradient in the Euclidean norm), what was seen outside
the project. NeMo-RL computes log-probabilities in float32 (``prepare_loss_input`` casts the
float64 logits) and reports the loss as a float32 sum of its micro-batches' losses, so the
vocabulary's log-sum-exp split across tensor-parallel ranks, or the loss summed in other pieces,
differs by float32 rounding: measured here at most 7.7e-8 (gradient, tensor parallel) and
2.1e-7 (DMPO's reported value, a few float32 ulps); the other gradients are bitwise equal
(each token's gradient is computed from that token alone).

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

from parallel_loss_ranks import PLACE_KEY, token_places
from test_dmpo_nemo_rl import training_batch

from nemo_mmpo import compute_advantages
from nemo_mmpo.nemo_rl import install
from nemo_mmpo.nemo_rl.dmpo_batch_terms import attach_penalty_terms, read_dmpo_settings
from nemo_mmpo.nemo_rl.loss import DMPOLossFn, MMPOClippedPGLossFn
from nemo_mmpo.nemo_rl.versions import fused_packing_overruns_rows

TESTS = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-6
VOCABULARY = 64  # the batch helper's response tokens are 10..59
CONTROL = "clipped_pg"
LOSSES = ("mmpo", "dmpo", CONTROL)

# NeMo-RL's policy settings for each layout, as recipe overrides (data parallel is what the
# ranks leave: tensor x context x data ranks). One global batch: one optimizer step.
ONE_STEP = ["policy.train_global_batch_size=8"]
UNPACKED = ["policy.sequence_packing.enabled=false"]
PACKED = ["policy.sequence_packing.enabled=true", "policy.sequence_packing.train_mb_tokens=48"]
FUSED = [*PACKED, "++policy.sequence_packing.fuse_loss=true"]
CP2 = ["policy.megatron_cfg.context_parallel_size=2", "policy.make_sequence_length_divisible_by=4"]
TP2 = ["policy.megatron_cfg.tensor_model_parallel_size=2"]
DYNAMIC = [
    *UNPACKED,
    "policy.dynamic_batching.enabled=true",
    "policy.dynamic_batching.train_mb_tokens=48",
    "policy.dynamic_batching.sequence_length_round=4",
]
REFERENCE = "one process"
# name: (tensor, context, data, overrides)
LAYOUTS = {
    REFERENCE: (1, 1, 1, [*UNPACKED, "policy.train_micro_batch_size=8"]),
    "tp2": (2, 1, 1, [*TP2, *UNPACKED, "policy.train_micro_batch_size=2"]),
    "cp2": (1, 2, 1, [*CP2, *PACKED]),
    "dp2": (1, 1, 2, DYNAMIC),
    "tp2xdp2": (2, 1, 2, [*TP2, *FUSED]),
    "cp2xdp2": (1, 2, 2, [*CP2, *PACKED]),
    "tp2xcp2": (2, 2, 1, [*TP2, *CP2, *FUSED]),
}
PARALLEL = [name for name in LAYOUTS if name != REFERENCE]
# The packer pads each packed row to the longest micro-batch's (pipeline parallel) or to a
# multiple of 128 tokens (blockwise FP8) and the last sequence absorbs the padding.
BIN_PADDING = {
    "pp2 fused": (1, 1, 1, [*FUSED, "policy.megatron_cfg.pipeline_model_parallel_size=2"]),
    "fp8 fused": (1, 1, 1, [*FUSED, "policy.megatron_cfg.fp8_cfg.enabled=true"]),
    "pp2 unfused": (1, 1, 1, [*PACKED, "policy.megatron_cfg.pipeline_model_parallel_size=2"]),
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


def logits_and_batch():
    """``[8, width, 64]`` float64 logits and NeMo-RL's ``train_data`` for them: two prompt groups
    of four, mixed rewards, one sample filtered, rows padded as ``grpo_train`` pads them, and
    ``prev_logprobs`` near the logits' own (as at a later optimizer step, so some ratios are
    clipped)."""
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
    input_ids = data["input_ids"]
    logits = 2 * torch.randn(*input_ids.shape, VOCABULARY, generator=generator, dtype=torch.float64)
    own = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]
    noise = 0.3 * torch.randn(own.shape, generator=generator, dtype=torch.float64)
    prev_logprobs = torch.zeros_like(data["prev_logprobs"])
    prev_logprobs[:, 1:] = (own + noise) * data["token_mask"][:, 1:]
    data["prev_logprobs"] = prev_logprobs
    data["generation_logprobs"] = prev_logprobs.clone()
    data[PLACE_KEY] = token_places(input_ids)
    assert int(data["input_lengths"].max()) <= 24
    return logits, data


def layout_spec(name, layout, may_fail=False):
    tensor, context, data, overrides = layout
    policy = master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml", [*ONE_STEP, *overrides]).policy
    return {
        "name": name,
        "tensor": tensor,
        "context": context,
        "data": data,
        "policy": policy,
        "may_fail": may_fail,
    }


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every layout's step for every loss, from ``tests/parallel_loss_ranks.py``: a launch of 2
    ranks (one process, the 2-process layouts, the bin-padding cases) and one of 4."""
    losses, dmpo_settings = build_losses()
    logits, data = logits_and_batch()
    dmpo_data = data.select_indices(list(range(data.size)))
    attach_penalty_terms(dmpo_data, dmpo_settings)  # what grpo_train does for dmpo
    two = [name for name, layout in LAYOUTS.items() if layout[0] * layout[1] * layout[2] <= 2]
    four = [name for name in LAYOUTS if name not in two]
    spec = {
        "logits": logits,
        "losses": {
            name: (loss_fn, dmpo_data if name == "dmpo" else data)
            for name, loss_fn in losses.items()
        },
        "launches": [
            {
                "index": 0,
                "world": 2,
                "layouts": [layout_spec(name, LAYOUTS[name]) for name in two]
                + [layout_spec(name, layout, True) for name, layout in BIN_PADDING.items()],
            },
            {
                "index": 1,
                "world": 4,
                "layouts": [layout_spec(name, LAYOUTS[name]) for name in four],
            },
        ],
    }
    folder = tmp_path_factory.mktemp("parallel_loss")
    torch.save(spec, folder / "spec.pt")
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join([str(TESTS), environment.get("PYTHONPATH", "")])
    started = time.monotonic()
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "from parallel_loss_ranks import main; main()",
            str(folder / "spec.pt"),
            str(folder),
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.monotonic() - started
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    results = {}
    for launch in spec["launches"]:
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


def relative(result, reference):
    """Relative difference of the reported loss, and of the gradient in the Euclidean norm."""
    value = abs(result["loss"] - reference["loss"]) / abs(reference["loss"])
    gradient = (result["gradient"] - reference["gradient"]).norm() / reference["gradient"].norm()
    return value, float(gradient)


def compared(result, reference):
    value, gradient = relative(result, reference)
    agree = value <= TOLERANCE and gradient <= TOLERANCE
    return agree, f"value rel {value:.1e}, grad rel {gradient:.1e}: {'ok' if agree else 'FAILED'}"


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("layout", PARALLEL)
def test_parallel_step_matches_one_process(outcomes, report, layout, loss):
    results = outcomes["results"]
    agree, line = compared(results[(layout, loss)], results[(REFERENCE, loss)])
    report.append(f"parallel-loss {snapshot_name()} {loss} {layout}: {line}")
    assert agree, line


def test_the_layouts_split_the_batch_as_configured(outcomes, report):
    """Each layout ran on the ranks and with the micro-batches its settings ask for, so the
    comparisons cover tensor, context and data parallel, micro-batches, dynamic batching, and
    packing fused and per sequence: not one path seven times."""
    results = outcomes["results"]
    report.append(
        f"parallel-loss {snapshot_name()}: {len(results)} steps on 2 and 4 gloo ranks "
        f"in {outcomes['seconds']:.0f} s"
    )

    def calls(layout):  # per rank, per micro-batch: what the model was given
        return results[(layout, CONTROL)]["calls_per_rank"]

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
    for layout in ("cp2", "tp2xdp2", "cp2xdp2", "tp2xcp2"):
        assert all(call["packed"] and call["shape"][0] == 1 for r in calls(layout) for call in r)
    # rank = tensor + 2 x (context or data): context and data ranks split the tokens, tensor
    # ranks share them
    for layout, splits, shares in (
        ("cp2", [(0, 1)], []),
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


def test_the_comparisons_are_not_vacuous(outcomes):
    """MMPO's loss is NeMo-RL's, so equal to the control in every layout; DMPO's penalty moves
    the gradient far beyond the tolerance, so matching the one-process DMPO step means the
    penalty's terms reached every rank's loss."""
    results = outcomes["results"]
    for layout in LAYOUTS:
        mmpo, control = results[(layout, "mmpo")], results[(layout, CONTROL)]
        assert mmpo["loss"] == control["loss"]
        assert torch.equal(mmpo["gradient"], control["gradient"])
        _, apart = relative(results[(layout, "dmpo")], control)
        assert apart > 1e3 * TOLERANCE


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
        result = results[(case, loss)]
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
            agree, line = compared(result, results[(REFERENCE, loss)])
            report.append(f"parallel-loss {snapshot_name()} {loss} {case}: {line}")
            assert agree, line
    if import_nemo_rl("nemo_rl").__version__ == "0.7.0":
        assert fused_packing_overruns_rows(root)
