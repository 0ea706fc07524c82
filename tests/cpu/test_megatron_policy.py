"""NeMo-RL's own ``MegatronPolicyWorker`` (through NeMo-RL's ``Policy`` and Ray, with the CPU
answers of ``nemo_mmpo/cpu/answers/megatron_shims.py``) against one process.

The worker imports the tiny Llama's Hugging Face folder through Megatron-Bridge and trains it
with NeMo-RL's ``ClippedPGLossFn`` and megatron-core's Adam (no weight decay, clipping at 1.0);
the one-process policy is the same Hugging Face model in this process with torch's AdamW at the
same settings. What holds by construction, up to float32 rounding: the log-probs (at the
sampler's temperature, 0.7 here) equal a ``transformers`` forward of the same weights; a step's
loss and gradient norm are the same; the step moves the log-probs the same way; a policy resumed
from the worker's own Megatron checkpoint takes the same next step as the one that saved it.

What needs Ray and NeMo-RL's ``Policy`` starting actors is here (one layout, tensor parallel 2:
the actors, Ray's ``worker_process_setup_hook`` installing the CPU answers, the refit's weight
names); the other layouts (pipeline, context and data parallel, their products, the pipeline
temperature pin) run the same worker class on gloo ranks without Ray, at a fraction of the cost:
``tests/nemo_rl_adapter/test_megatron_layouts.py``.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from nemo_rl_support import import_nemo_rl, master_config_from_recipe

# on NeMo-RL main (passed on both); both tests on request (NEMO_MMPO_BEYOND_CI=1)
pytestmark = [pytest.mark.nemo_rl, pytest.mark.main_snapshot]
loss_module = import_nemo_rl("nemo_rl.algorithms.loss")
import_nemo_rl("megatron.core")
if importlib.util.find_spec("megatron.bridge") is None:  # imported in the workers only (TE)
    import_nemo_rl("megatron.bridge")  # skips, or fails under CI, naming what is missing
BatchedDataDict = import_nemo_rl("nemo_rl.distributed.batched_data_dict").BatchedDataDict
checkpoint_module = import_nemo_rl("nemo_rl.utils.checkpoint")

from nemo_mmpo.cpu.answers import megatron_shims
from nemo_mmpo.cpu.engines import megatron_policy
from nemo_mmpo.cpu.engines.policy import CPUPolicy
from nemo_mmpo.cpu.engines.ray_cluster import ray_session
from nemo_mmpo.cpu.rig.model import ModelShape, char_tokenizer, tiny_llama

LEARNING_RATE = 1e-3
TEMPERATURE = 0.7
#: float32 through two different graphs (sharded matmuls, packed attention): relative
TOLERANCE = 1e-5
LAYOUTS = {"tp2": ["policy.megatron_cfg.tensor_model_parallel_size=2"]}


def policy_config(layout: str, start_folder) -> dict:
    """The Megatron tiny recipe's ``policy`` section (sequence packing and the distributed
    optimizer on, as the GPU recipe), 16 rows a step in micro-batches of 4, Adam at
    :data:`LEARNING_RATE`, the sampler at :data:`TEMPERATURE`."""
    lr = f"{LEARNING_RATE}"
    overrides = [
        "policy.train_global_batch_size=16",
        "policy.train_micro_batch_size=4",
        "policy.logprob_batch_size=4",
        f"policy.generation.temperature={TEMPERATURE}",
        f"policy.megatron_cfg.optimizer.lr={lr}",
        f"policy.megatron_cfg.optimizer.min_lr={lr}",
        f"policy.megatron_cfg.scheduler.lr_warmup_init={lr}",
        *LAYOUTS[layout],
    ]
    master = master_config_from_recipe("mmpo_tiny_cpu_megatron.yaml", overrides)
    policy, grpo = dict(master.policy), dict(master.grpo)
    return megatron_policy.megatron_policy_config(policy, grpo, 1000, start_folder)


def training_batch(tokenizer, generator) -> BatchedDataDict:
    """16 sums with right or wrong answers, ragged; the answer is the response (token mask), its
    advantage +-1, one row masked out."""
    texts, prompt_lengths = [], []
    for row in range(16):
        a, b = (int(x) for x in torch.randint(0, 100, (2,), generator=generator))
        wrong = 0 if row % 2 == 0 else int(torch.randint(1, 9, (1,), generator=generator))
        prompt = f"{a}+{b}="
        texts.append(f"{prompt}\\boxed{{{a + b + wrong}}}")
        prompt_lengths.append(len(prompt))
    encoded = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    width = -(-max(map(len, encoded)) // 4) * 4
    input_ids = torch.full((16, width), tokenizer.pad_token_id)
    token_mask = torch.zeros(16, width)
    for row, ids in enumerate(encoded):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        token_mask[row, prompt_lengths[row] : len(ids)] = 1.0
    advantages = torch.tensor([1.0 if row % 2 == 0 else -1.0 for row in range(16)])
    sample_mask = torch.ones(16)
    sample_mask[5] = 0.0
    return BatchedDataDict(
        {
            "input_ids": input_ids,
            "input_lengths": torch.tensor([len(ids) for ids in encoded]),
            "token_mask": token_mask,
            "sample_mask": sample_mask,
            "advantages": advantages[:, None].expand(16, width).clone(),
        }
    )


def on_policy(data: BatchedDataDict, logprobs: torch.Tensor) -> BatchedDataDict:
    return BatchedDataDict({**data, "prev_logprobs": logprobs, "generation_logprobs": logprobs})


def relative(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if mask is not None:
        a, b = a[mask], b[mask]
    return float((a.double() - b.double()).norm() / b.double().norm())


def response_mask(data: BatchedDataDict) -> torch.Tensor:
    positions = torch.arange(data["input_ids"].shape[1])
    return (positions >= 1) & (positions < data["input_lengths"][:, None])


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """The seeded tiny Llama saved as the policy's Hugging Face folder, its tokenizer, NeMo-RL's
    clipped loss and one training batch; a Ray session with the Megatron worker's CPU
    answers."""
    tokenizer = char_tokenizer()
    model = tiny_llama(tokenizer, ModelShape(), seed=3)
    folder = megatron_policy.save_start_folder(model, tokenizer, tmp_path_factory.mktemp("run"))
    loss = loss_module.ClippedPGLossFn(master_config_from_recipe("mmpo_tiny_cpu.yaml").loss_fn)
    data = training_batch(tokenizer, torch.Generator().manual_seed(0))
    with ray_session(megatron_shims.SETUP_HOOK, num_cpus=4):
        yield model, tokenizer, loss, data, folder


def one_process(start, layout):
    model, tokenizer, _, _, folder = start
    config = dict(policy_config(layout, folder), optimizer={"kwargs": {"lr": LEARNING_RATE}})
    return CPUPolicy(copy.deepcopy(model), tokenizer, config)


def worker_policy(start, layout, weights_path=None, optimizer_path=None):
    _, tokenizer, _, _, folder = start
    config = policy_config(layout, folder)
    return megatron_policy.start_megatron_policy(
        config, tokenizer, 2, weights_path=weights_path, optimizer_path=optimizer_path
    )


# CI time: tests/nemo_rl_adapter/test_megatron_layouts.py runs NeMo-RL's Policy and worker on
# gloo ranks and equals one process, and the Megatron tiny runs (both snapshots) are on-policy
# through Ray at every step; this Ray start on request (NEMO_MMPO_BEYOND_CI=1)
@pytest.mark.beyond_ci
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_step_of_nemo_rls_worker_equals_the_one_process_step(start, layout):
    """Log-probs (equal to ``transformers``'), the step's loss and gradient norm, and the
    log-probs after the step."""
    _, _, loss, data, _ = start
    reference = one_process(start, layout)
    policy = worker_policy(start, layout)
    try:
        assert policy.sharding_annotations.get_axis_size("data_parallel") == 1
        mask = response_mask(data)
        expected = reference.get_logprobs(data)["logprobs"]
        got = policy.get_logprobs(data)["logprobs"]
        assert got.shape == expected.shape
        assert relative(got, expected, mask) < TOLERANCE
        plain = copy.deepcopy(reference)
        plain.temperature = 1.0  # the sampler's temperature reached the workers
        assert relative(plain.get_logprobs(data)["logprobs"], expected, mask) > 100 * TOLERANCE

        batch = on_policy(data, expected)
        mine, theirs = policy.train(batch, loss), reference.train(batch, loss)
        assert relative(mine["loss"], theirs["loss"]) < TOLERANCE
        assert relative(mine["grad_norm"], theirs["grad_norm"]) < TOLERANCE
        moved = reference.get_logprobs(data)["logprobs"] - expected
        moved_here = policy.get_logprobs(data)["logprobs"] - expected
        assert moved[mask].abs().max() > 1e-3  # the step changed the policy
        assert relative(moved_here, moved, mask) < 1e-2
        # the refit's weights: Megatron-Bridge's export, under the Hugging Face names
        assert set(policy.prepare_refit_info()) == set(reference.model.state_dict())
    finally:
        megatron_policy.shutdown_megatron_policy(policy)


# CI time (on request, NEMO_MMPO_BEYOND_CI=1): in CI, main's grpo_train_sync run is killed and
# resumed from the same workers' checkpoint, and NeMo-RL's get_resume_paths finds its optimizer
# state there (test_tiny_run_sync.py); this is the step-for-step equality, and the check of
# the CPU answer megatron_shims._own_adam_steps
@pytest.mark.beyond_ci
def test_a_policy_resumed_from_the_workers_checkpoint_takes_the_same_next_step(start, tmp_path):
    """Two steps, NeMo-RL's Megatron checkpoint (``torch_dist`` weights and optimizer), a third
    step; a new ``Policy`` started from that checkpoint has the same weights, the third step's
    loss and gradient norm, and the same weights after its Adam step. The last needs the CPU
    answer ``megatron_shims._own_adam_steps``: on torch's Adam megatron-core's load leaves one
    shared ``step`` tensor in all parameters' states holding the pre-load step
    (``distrib_optimizer.py:1028-1032, :1219-1225``), which the next step advances once per
    parameter (without the answer, after one saved step, log-probs 0.43 apart); the answer
    fails the load if megatron-core restores the step itself.

    The resumed policy's paths are the ones ``grpo_train``'s setup resumes from: NeMo-RL's
    ``CheckpointManager.get_resume_paths`` on the step folder, laid out as ``grpo_train`` saves
    it (``step_2/policy/weights``, ``.../optimizer``). It returns no optimizer path where it
    cannot find the optimizer in the workers' checkpoint, and the resumed step then starts a
    fresh Adam (NeMo-RL v0.7.0, which looks only for a legacy ``common.pt``; docs/cpu-answers.md):
    the test asks for the optimizer path, so it fails there."""
    _, _, loss, data, _ = start
    step_folder = tmp_path / "step_2"
    policy = worker_policy(start, "tp2")
    try:
        for _ in range(2):  # Adam's step 2 is saved: a fresh optimizer's would be 1
            policy.train(on_policy(data, policy.get_logprobs(data)["logprobs"]), loss)
        policy.save_checkpoint(
            str(step_folder / "policy" / "weights"), str(step_folder / "policy" / "optimizer")
        )
        batch = on_policy(data, policy.get_logprobs(data)["logprobs"])
        continued = policy.train(batch, loss)
        after = policy.get_logprobs(data)["logprobs"]
    finally:
        megatron_policy.shutdown_megatron_policy(policy)
    weights, optimizer = checkpoint_module.CheckpointManager.get_resume_paths(step_folder)
    assert optimizer is not None, "NeMo-RL's resume finds no optimizer state: a fresh Adam"
    resumed = worker_policy(start, "tp2", str(weights), str(optimizer))
    try:
        torch.testing.assert_close(resumed.get_logprobs(data)["logprobs"], batch["prev_logprobs"])
        again = resumed.train(batch, loss)
        assert torch.equal(torch.as_tensor(again["loss"]), torch.as_tensor(continued["loss"]))
        assert relative(again["grad_norm"], continued["grad_norm"]) < TOLERANCE
        torch.testing.assert_close(resumed.get_logprobs(data)["logprobs"], after)
    finally:
        megatron_policy.shutdown_megatron_policy(resumed)
