"""Our losses through NeMo-RL's own ``Policy`` and ``MegatronPolicyWorker``, in parallel.

NeMo-RL's ``MegatronPolicyWorker`` (with the CPU answers of
``nemo_mmpo/cpu/answers/megatron_shims.py``) imports a tiny Llama's Hugging Face folder through
Megatron-Bridge and takes three optimizer steps in turn, ``loss_fn.name`` ``mmpo``, ``dmpo``
(built as NeMo-RL's ``setup()`` builds them after ``install()``) and NeMo-RL's own
``clipped_pg`` (the control), each followed by ``get_logprobs``, through NeMo-RL's ``Policy``
(its sharding, its gathering), on gloo rank processes of this machine's CPU, one per rank,
without Ray (``tests/megatron_layout_ranks.py``; the Ray path is
``tests/cpu/test_megatron_policy.py``'s). Under tensor parallel 2, pipeline parallel 2, context
parallel 2 with sequence packing, data parallel 2 with the distributed optimizer and dynamic
batching, and the 4-rank products TP2 x PP2 (packed), TP2 x DP2 (fused packed loss), CP2 x DP2
and TP2 x CP2 (fused), every step's loss and gradient norm and the log-probs before and after
it equal the one-process worker's (tensor parallel 1 on one rank), whose log-probs equal a
``transformers`` forward of the same weights; the data- and context-parallel replicas hold
identical parameters after the steps.

Tolerance: 1e-5 relative (loss, gradient norm; log-probs in the Euclidean norm over each row's
tokens). The model runs in float32 and each layout sums in another order (matrix products split
over tensor-parallel ranks, the vocabulary's log-sum-exp split, attention over gathered keys,
micro-batches of other sizes): float32's unit roundoff is 6e-8 and forward and backward chain a
few dozen such sums. Adam's step divides each gradient by its own root mean square, which
carries those differences into the weights at the learning rate's scale; the log-probs after a
step are compared at the same tolerance, and the steps move them by far more (asserted). The
replica check is exact: every replica holds the same all-reduced gradients and does the same
arithmetic.

Also here: NeMo-RL's Megatron forward divides the hidden state between pipeline stages by the
sampler's temperature (pinned: ``pp2 at 0.7``), and NeMo-RL v0.7.0's fused packed loss
(``policy.sequence_packing.fuse_loss: true``) crashes when the packer pads a packed row past the
unpacked rows (pipeline parallel): ``_pack_input_ids`` copies the padded length out of the row.
``--dry-run`` refuses those settings on a checkout with that code (``nemo_mmpo/launch/rules.py``,
``fused_sequence_packing``).
"""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from nemo_rl_support import import_nemo_rl, master_config_from_recipe, nemo_rl_checkout

pytestmark = [pytest.mark.nemo_rl, pytest.mark.alternating]

grpo = import_nemo_rl("nemo_rl.algorithms.grpo")
loss_module = import_nemo_rl("nemo_rl.algorithms.loss")
import_nemo_rl("megatron.core")
if importlib.util.find_spec("megatron.bridge") is None:  # imported in the ranks only (TE)
    import_nemo_rl("megatron.bridge")  # skips, or fails under CI, naming what is missing

from megatron_layout_ranks import LOSSES, PLACE_KEY, token_places
from test_dmpo_nemo_rl import training_batch

from nemo_mmpo import compute_advantages
from nemo_mmpo.cpu.engines import megatron_policy
from nemo_mmpo.cpu.rig.model import ModelShape, char_tokenizer, tiny_llama
from nemo_mmpo.nemo_rl import install
from nemo_mmpo.nemo_rl.dmpo_batch_terms import read_dmpo_settings
from nemo_mmpo.nemo_rl.loss import DMPOLossFn, MMPOClippedPGLossFn
from nemo_mmpo.nemo_rl.versions import fused_packing_overruns_rows

TESTS = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-5
CONTROL = "clipped_pg"
LEARNING_RATE = 1e-3
PINNED_TEMPERATURE = 0.7

# NeMo-RL's policy settings for each layout, as overrides of the Megatron tiny recipe (data
# parallel is what the ranks leave). One global batch a step.
ONE_STEP = [
    "policy.train_global_batch_size=8",
    "policy.logprob_batch_size=2",
    "policy.generation.temperature=1.0",
    f"policy.megatron_cfg.optimizer.lr={LEARNING_RATE}",
    f"policy.megatron_cfg.optimizer.min_lr={LEARNING_RATE}",
    f"policy.megatron_cfg.scheduler.lr_warmup_init={LEARNING_RATE}",
    "policy.megatron_cfg.tensor_model_parallel_size=1",
]
UNPACKED = ["policy.sequence_packing.enabled=false", "policy.dynamic_batching.enabled=false"]
PACKED = [
    "policy.dynamic_batching.enabled=false",
    "policy.sequence_packing.enabled=true",
    "policy.sequence_packing.train_mb_tokens=48",
    "++policy.sequence_packing.logprob_mb_tokens=48",
]
FUSED = [*PACKED, "++policy.sequence_packing.fuse_loss=true"]
TP2 = ["policy.megatron_cfg.tensor_model_parallel_size=2"]
PP2 = ["policy.megatron_cfg.pipeline_model_parallel_size=2"]
CP2 = ["policy.megatron_cfg.context_parallel_size=2", "policy.make_sequence_length_divisible_by=4"]
DYNAMIC = [
    "policy.sequence_packing.enabled=false",
    "policy.dynamic_batching.enabled=true",
    "policy.dynamic_batching.train_mb_tokens=48",
    "policy.dynamic_batching.logprob_mb_tokens=48",
    "policy.dynamic_batching.sequence_length_round=4",
]
REFERENCE = "one process"
PINNED = f"pp2 at {PINNED_TEMPERATURE}"
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
REPLICATED = ["cp2+packing", "dp2", "tp2xdp2", "cp2xdp2"]
# log-probs only, at the sampler's temperature 0.7 (see the pin below)
TEMPERATURE_PIN = (
    1,
    2,
    1,
    1,
    [*PP2, *UNPACKED, f"policy.generation.temperature={PINNED_TEMPERATURE}"],
)
# The packer pads each packed row to the longest micro-batch's under pipeline parallel and the
# last sequence absorbs the padding; v0.7.0's fused loss then crashes (its last launch: the
# failing stage ends the launch).
FUSED_PP2 = (1, 2, 1, 1, [*FUSED, *PP2])


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
    # the registered losses, checked at their first call in each worker (nemo_mmpo.contracts)
    assert isinstance(losses["mmpo"], MMPOClippedPGLossFn) and isinstance(
        losses["dmpo"], DMPOLossFn
    )
    assert not isinstance(losses["mmpo"], DMPOLossFn)
    assert type(losses[CONTROL]) is loss_module.ClippedPGLossFn
    assert tuple(losses) == LOSSES
    return losses, read_dmpo_settings(dmpo.loss_fn)


def batch_and_noise():
    """NeMo-RL's ``train_data`` ``[8, width]``: two prompt groups of four, mixed rewards, one
    sample filtered, rows padded as ``grpo_train`` pads them; and per step the noise
    ``[8, width]`` added to the log-probs to make ``prev_logprobs``
    (``megatron_layout_ranks.step_data``)."""
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
    shape = (len(LOSSES), *data["input_ids"].shape)
    noise = 0.3 * torch.randn(shape, generator=generator, dtype=torch.float64)
    data[PLACE_KEY] = token_places(data["input_ids"])
    assert int(data["input_lengths"].max()) <= 24
    return data, noise


def layout_spec(name: str, layout: tuple, start_folder: Path, may_fail: bool = False) -> dict:
    tensor, pipeline, context, data, overrides = layout
    master = master_config_from_recipe("mmpo_tiny_cpu_megatron.yaml", [*ONE_STEP, *overrides])
    policy = megatron_policy.megatron_policy_config(
        dict(master.policy), dict(master.grpo), 1000, start_folder
    )
    # the GPU recipe's distributed optimizer: data-parallel layouts shard Adam's state
    assert policy["megatron_cfg"]["optimizer"]["use_distributed_optimizer"]
    return {
        "name": name,
        "world": tensor * pipeline * context * data,
        "data": data,
        "policy": policy,
        "may_fail": may_fail,
        "logprobs_only": name == PINNED,
    }


def world(layout: tuple) -> int:
    tensor, pipeline, context, data, _ = layout
    return tensor * pipeline * context * data


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """The seeded tiny Llama (hidden 64) and its Hugging Face folder."""
    tokenizer = char_tokenizer()
    model = tiny_llama(tokenizer, ModelShape(hidden_size=64, num_heads=4), seed=3)
    folder = megatron_policy.save_start_folder(model, tokenizer, tmp_path_factory.mktemp("run"))
    return model, tokenizer, folder


@pytest.fixture(scope="module")
def outcomes(start, tmp_path_factory):
    """Every layout's log-probs and steps from ``tests/megatron_layout_ranks.py``: launches of
    1 rank (the reference, whose log-probs make every layout's ``train_data``), 2 and 4 ranks,
    and last the layout that may crash."""
    _, tokenizer, folder = start
    losses, dmpo_settings = build_losses()
    data, noise = batch_and_noise()
    groups = [[REFERENCE], [*(n for n in PARALLEL if world(LAYOUTS[n]) == 2), PINNED]]
    groups.append([n for n in PARALLEL if world(LAYOUTS[n]) == 4])
    every = {**LAYOUTS, PINNED: TEMPERATURE_PIN}
    launches = [
        {
            "index": index,
            "world": world(every[names[0]]),
            "layouts": [layout_spec(name, every[name], folder) for name in names],
        }
        for index, names in enumerate(groups)
    ]
    fused = {"index": len(launches), "world": 2}
    fused["layouts"] = [layout_spec("pp2 fused", FUSED_PP2, folder, may_fail=True)]
    launches.append(fused)
    spec = {
        "tokenizer": tokenizer,
        "batch": data,
        "prev_noise": noise,
        "losses": losses,
        "dmpo_settings": dmpo_settings,
        "launches": launches,
    }
    out = tmp_path_factory.mktemp("layouts")
    torch.save(spec, out / "spec.pt")
    environment = dict(os.environ, TORCHDYNAMO_DISABLE="1", HF_HUB_OFFLINE="1")
    environment["PYTHONPATH"] = os.pathsep.join([str(TESTS), environment.get("PYTHONPATH", "")])
    started = time.monotonic()
    command = "from megatron_layout_ranks import main; main()"
    run = subprocess.run(
        [sys.executable, "-c", command, str(out / "spec.pt"), str(out)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    )
    seconds = time.monotonic() - started
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-8000:]
    results = {}
    for launch in launches[:-1]:
        results.update(torch.load(out / f"launch-{launch['index']}.pt", weights_only=False))
    fused_outcome = out / f"launch-{fused['index']}.pt"
    if not fused_outcome.exists():  # it crashed: the last stage's outcome (it computes the loss)
        fused_outcome = out / f"launch-{fused['index']}-rank{fused['world'] - 1}.pt"
    results.update(torch.load(fused_outcome, weights_only=False))
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


def tokens_of(data) -> torch.Tensor:
    """``[batch, seq_len]``: each row's tokens after the first (the rest is padding)."""
    positions = torch.arange(data["input_ids"].shape[1])
    return (positions >= 1) & (positions < data["input_lengths"][:, None])


def logprob_gap(logprobs: torch.Tensor, reference: torch.Tensor, data) -> float:
    """Relative difference (Euclidean norm) of ``[batch, seq_len]`` log-probs at each row's
    tokens."""
    tokens = tokens_of(data)
    return float((logprobs - reference)[tokens].norm() / reference[tokens].norm())


def relative(value: float, reference: float) -> float:
    return abs(value - reference) / abs(reference)


def hugging_face_logprobs(model, data, temperature=1.0, divide_first_layer=False):
    """A ``transformers`` forward of the start weights at the sampler's ``temperature``,
    NeMo-RL's layout (position ``i`` holds log p(token i | tokens < i), 0 at 0);
    ``divide_first_layer``: the first layer's output divided by the temperature too."""
    model = copy.deepcopy(model).eval()
    if divide_first_layer:

        def divided(module, inputs, output):
            if isinstance(output, tuple):
                return (output[0] / temperature, *output[1:])
            return output / temperature

        model.model.layers[0].register_forward_hook(divided)
    ids = data["input_ids"]
    attention = torch.arange(ids.shape[1]) < data["input_lengths"][:, None]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention.long()).logits.float()
    picked = torch.log_softmax(logits[:, :-1] / temperature, -1).gather(-1, ids[:, 1:, None])
    return torch.nn.functional.pad(picked[..., 0], (1, 0))


@pytest.mark.parametrize("layout", PARALLEL)
def test_parallel_steps_match_one_process(outcomes, report, layout):
    mine, reference = outcomes["results"][layout], outcomes["results"][REFERENCE]
    data = outcomes["data"]
    before = logprob_gap(mine["logprobs"], reference["logprobs"], data)
    lines, agree = [f"logprobs rel {before:.1e}"], before <= TOLERANCE
    for loss in LOSSES:
        step, one = mine["steps"][loss], reference["steps"][loss]
        gaps = (
            relative(step["loss"], one["loss"]),
            relative(step["grad_norm"], one["grad_norm"]),
            logprob_gap(step["logprobs"], one["logprobs"], data),
        )
        agree &= max(gaps) <= TOLERANCE
        lines.append(
            f"{loss} loss rel {gaps[0]:.1e}, grad norm rel {gaps[1]:.1e}, "
            f"logprobs after rel {gaps[2]:.1e}"
        )
    verdict = "ok" if agree else "FAILED"
    report.append(f"parallel-loss {snapshot_name()} {layout}: {'; '.join(lines)}: {verdict}")
    assert agree, lines


@pytest.mark.parametrize("layout", REPLICATED)
def test_replicas_stay_identical_after_the_optimizer_steps(outcomes, report, layout):
    """megatron-core's DDP all-reduces the gradient buffers over data and context parallel (the
    distributed optimizer gathers the updated shards), so every replica holds the same
    parameters after the steps: exactly."""
    gap = outcomes["results"][layout]["replica_gap"]
    line = f"largest difference between replicas' parameters after {len(LOSSES)} steps {gap:.1e}"
    report.append(f"parallel-loss {snapshot_name()} {layout} after Adam: {line}")
    assert gap == 0.0


def test_the_one_process_worker_is_the_hugging_face_model(start, outcomes, report):
    """The reference itself: NeMo-RL's worker at tensor parallel 1 computes the log-probs of a
    ``transformers`` forward of the weights it imported; the steps moved them (far beyond the
    tolerance); MMPO's first step is NeMo-RL's clipped step (same loss), DMPO's penalty moves
    the gradient norm far beyond the tolerance (the comparisons are not vacuous)."""
    model = start[0]
    data = outcomes["data"]
    reference = outcomes["results"][REFERENCE]
    gap = logprob_gap(reference["logprobs"], hugging_face_logprobs(model, data), data)
    moved = [
        logprob_gap(reference["steps"][loss]["logprobs"], reference["logprobs"], data)
        for loss in LOSSES
    ]
    report.append(
        f"parallel-loss {snapshot_name()} one process vs transformers: logprobs rel {gap:.1e}; "
        f"the steps moved them by rel {', '.join(f'{m:.1e}' for m in moved)}"
    )
    assert gap <= TOLERANCE
    assert min(moved) > 100 * TOLERANCE


def test_the_layouts_split_the_batch_as_configured(outcomes, report):
    """Each layout ran on the ranks and with the micro-batches its settings ask for, so the
    comparisons cover tensor, pipeline, context and data parallel, micro-batches, dynamic
    batching, and packing fused and per sequence: not one path eight times."""
    results = outcomes["results"]
    report.append(
        f"parallel-loss {snapshot_name()}: {len(LAYOUTS)} layouts x {len(LOSSES)} steps through "
        f"NeMo-RL's MegatronPolicyWorker on 1, 2 and 4 gloo ranks in {outcomes['seconds']:.0f} s "
        f"(megatron-core {importlib.metadata.version('megatron-core')})"
    )

    def calls(layout):  # per rank, per micro-batch of the control's step: what the model got
        return [rank[LOSSES.index(CONTROL)] for rank in results[layout]["calls_per_rank"]]

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
    assert tokens(REFERENCE, 0) >= every_token
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
    # ranks share them; a pipeline's first stage is given the tokens, the last one too
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


def test_nemo_rl_divides_the_hidden_state_between_pipeline_stages_by_the_temperature(
    start, outcomes, report
):
    """NeMo-RL's Megatron forward step (``forward_with_post_processing_fn``, v0.7.0 and main)
    divides its model's output by the sampler's temperature on every pipeline stage, not only
    the last: the hidden state a stage hands the next is divided too. Under pipeline parallel
    with a temperature other than 1 the log-probs (and the loss) are then not those of the
    model vLLM samples from (at 1.0, ``pp2`` above equals one process). Pinned exactly: PP2's
    log-probs at 0.7 are those of the Hugging Face model whose first layer's output is divided
    by 0.7 (and the logits by the temperature), not the model's own at 0.7. ``--dry-run`` warns
    about the setting (``pipeline_temperature`` rule); when NeMo-RL fixes it this test fails,
    and the rule and this test go."""
    model, data = start[0], outcomes["data"]
    got = outcomes["results"][PINNED]["logprobs"]
    own = hugging_face_logprobs(model, data, PINNED_TEMPERATURE)
    scaled = hugging_face_logprobs(model, data, PINNED_TEMPERATURE, divide_first_layer=True)
    line = f"vs divided per stage rel {logprob_gap(got, scaled, data):.1e}"
    report.append(f"parallel-loss {snapshot_name()} {PINNED}: {line}")
    assert logprob_gap(got, scaled, data) <= TOLERANCE
    assert logprob_gap(got, own, data) > 100 * TOLERANCE


def test_fused_packing_with_padded_rows(outcomes, report):
    """NeMo-RL v0.7.0's fused packed loss crashes in ``_pack_input_ids`` when the packer pads a
    packed row into its last sequence past the batch's rows (pipeline parallel); main clamps
    the copy and computes the one-process steps. ``fused_packing_overruns_rows``, the marker
    the ``--dry-run`` rule reads, must say which. (The per-sequence wrapper under pipeline
    parallel, the fix ``--dry-run`` names, is ``tp2xpp2`` above.)"""
    root = nemo_rl_checkout()
    result = outcomes["results"]["pp2 fused"]
    if fused_packing_overruns_rows(root):
        error = result.get("error") or {}
        message = error.get("error", "no error").split(" at non-singleton")[0]
        line = f"crashes in _pack_input_ids as expected ({message})"
        report.append(f"parallel-loss {snapshot_name()} pp2 fused: {line}")
        assert ("utils.py", "_pack_input_ids") in error.get("raised_in", []), result
        assert "must match the existing size" in error["error"]
    else:
        assert not result.get("error"), result
        reference = outcomes["results"][REFERENCE]
        gaps = [
            relative(result["steps"][loss]["loss"], reference["steps"][loss]["loss"])
            for loss in LOSSES
        ]
        report.append(
            f"parallel-loss {snapshot_name()} pp2 fused: loss rel "
            + ", ".join(f"{loss} {gap:.1e}" for loss, gap in zip(LOSSES, gaps, strict=True))
        )
        assert max(gaps) <= TOLERANCE
    if import_nemo_rl("nemo_rl").__version__ == "0.7.0":
        assert fused_packing_overruns_rows(root)
