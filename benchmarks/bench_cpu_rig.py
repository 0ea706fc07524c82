"""Time one GRPO step's worth of the CPU engines' work on the tiny recipe's model and batch.

Per step NeMo-RL asks the CPU rig to sample 64 responses (8 prompts x 8), for their
log-probabilities (``prev_logprobs``), and to train on them. This times each, as the rig does
it now, against a named baseline in the same run (medians of interleaved repeats):

- ``sample``: ``sample_batch`` (log-probabilities from the logits ``generate`` computed while
  sampling) against **the previous implementation**, ``generate`` then a second full forward
  pass for the log-probabilities;
- ``logprobs`` and ``train`` (forward + backward + AdamW on 64 sequences): absolute times, for
  the share of a step they take.

    .venv/bin/python benchmarks/bench_cpu_rig.py [--repeats 21] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from nemo_mmpo.cpu.model import ModelShape, char_tokenizer, tiny_llama
from nemo_mmpo.cpu.sampling import _generate, encode_prompts, sample_batch, token_logprobs
from nemo_mmpo.cpu.task import AdditionTask
from nemo_mmpo.cpu.warm_start import supervised_batch

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
    for _ in range(args.repeats):
        times["sample"].append(
            timed(lambda: sample_batch(model, tokenizer, input_ids, input_lengths, GENERATION))
        )
        times["previous sample"].append(
            timed(lambda: previous_sample(model, tokenizer, input_ids, input_lengths))
        )
        times["logprobs"].append(timed(logprobs))
        times["train"].append(timed(train_step))
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


if __name__ == "__main__":
    main()
