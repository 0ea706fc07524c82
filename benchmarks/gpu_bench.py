"""Time the estimator and the ``mmpo`` loss against NeMo-RL's on one device; write JSON.

The GPU check's timing part (``benchmarks/gpu_check.sh`` runs it with ``--device cuda``);
``--device cpu`` rehearses it anywhere NeMo-RL imports. Baselines, measured in the same run
on the same batch:

- estimators: NeMo-RL's ``GRPOAdvantageEstimator.compute_advantage`` against ours
  (``plugin`` T=4, ``unbiased`` T=8, and the whole adapter step
  ``MMPOAdvantageEstimator.compute_advantage``) and DMPO's per-batch penalty terms
  (``attach_penalty_terms``, prompt grouping from the tokens included), grouping from
  ``[batch, prompt_len]`` token rows included, at the paper's batch (16 prompts x 8, prompts
  of 1024 tokens) and larger;
- loss: ``loss_fn.name: mmpo`` (``MMPOClippedPGLossFn``) and ``dmpo`` (``DMPOLossFn``, on a
  batch with its terms attached) against NeMo-RL's ``ClippedPGLossFn`` with the paper's
  settings, forward and forward+backward, interleaved, at the paper's micro-batch
  (2 x 5120 tokens) and larger.

Every DMPO tensor is on ``--device``: the check fails if any of its code allocates elsewhere.

Each row holds the median seconds of both and ``ratio = ours / baseline``. Timing: the device
is synchronised before and after each call (``bench_estimators.time_call``,
``bench_loss.timed``), after one warm-up.

Usage: ``python benchmarks/gpu_bench.py --device cuda --out results.json``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_estimators
import bench_loss
import gpu_standins

PAPER_BATCH = "16x8"
ESTIMATOR_SIZES = "16x8,128x8,512x16,2048x32"
LOSS_SHAPES = "2x5120,8x8192,32x8192"


def dmpo_train_data(prompt_ids: torch.Tensor, response_len: int = 8) -> dict:
    """NeMo-RL's ``train_data`` as DMPO's batch terms read it: the prompts, then responses."""
    rows, device = prompt_ids.shape[0], prompt_ids.device
    responses = torch.randint(3, 32_000, (rows, response_len), device=device)
    input_ids = torch.cat([prompt_ids, responses], dim=1)
    token_mask = torch.cat([torch.zeros_like(prompt_ids), torch.ones_like(responses)], dim=1)
    return {
        "input_ids": input_ids,
        "token_mask": token_mask.float(),
        "sample_mask": torch.ones(rows, device=device),
        "advantages": torch.randn(rows, 1, device=device).expand(input_ids.shape),
        "prev_logprobs": -torch.rand(input_ids.shape, device=device),
    }


def attach_dmpo_terms(data) -> None:
    """DMPO's batch terms (paper settings) added to ``data``, checked to stay on its device."""
    from nemo_mmpo.nemo_rl.dmpo_batch_terms import (
        GRADIENT_KEY,
        SHARE_KEY,
        DMPOSettings,
        attach_penalty_terms,
    )

    attach_penalty_terms(data, DMPOSettings())
    device = data["prev_logprobs"].device
    assert data[SHARE_KEY].device == data[GRADIENT_KEY].device == device, "DMPO left the device"


def estimator_timings(grpo, batch, group_size: int, device: str, repeats: int, budget: float):
    """Median seconds of NeMo-RL's GRPO estimator and of ours on one ``(prompt_ids, rewards)``."""
    from nemo_mmpo.nemo_rl import MMPOAdvantageEstimator

    prompt_ids, rewards = batch
    mask = torch.ones(rewards.numel(), 8, device=device)
    adapter = MMPOAdvantageEstimator({"name": "mmpo", "truncation_order": 4})
    train_data = dmpo_train_data(prompt_ids)
    calls = {
        "nemo_rl_grpo": lambda: grpo.compute_advantage(prompt_ids, rewards, mask),
        "plugin T=4": lambda: bench_estimators.ours(prompt_ids, rewards, "plugin", 4),
        "unbiased T=8": lambda: bench_estimators.ours(
            prompt_ids, rewards, "unbiased", min(8, group_size)
        ),
        "adapter T=4": lambda: adapter.compute_advantage(prompt_ids, rewards, mask),
        "dmpo terms": lambda: attach_dmpo_terms(train_data),
    }
    return {
        label: bench_estimators.time_call(call, device, repeats, budget)
        for label, call in calls.items()
    }


def estimator_rows(sizes: str, prompt_len: int, device: str, repeats: int, budget: float):
    """One row per (batch, estimator): our median seconds against NeMo-RL's GRPO estimator."""
    import nemo_rl.algorithms.advantage_estimator  # noqa: F401  (fails loudly when absent)

    grpo = bench_estimators.nemo_rl_grpo_estimator()
    rows = []
    for size in sizes.split(","):
        num_prompts, group_size = (int(part) for part in size.split("x"))
        batch = bench_estimators.make_batch(num_prompts, group_size, prompt_len, device)
        timings = estimator_timings(grpo, batch, group_size, device, repeats, budget)
        baseline = timings.pop("nemo_rl_grpo")
        for label, seconds in timings.items():
            rows.append(
                {
                    "batch": size,
                    "paper_batch": size == PAPER_BATCH,
                    "rollouts": num_prompts * group_size,
                    "prompt_len": prompt_len,
                    "estimator": label,
                    "seconds": seconds,
                    "baseline": "nemo_rl GRPOAdvantageEstimator",
                    "baseline_seconds": baseline,
                    "ratio": seconds / baseline,
                }
            )
            print(
                f"estimator {size:>8} {label:>13}: {seconds * 1e3:9.3f} ms,"
                f" NeMo-RL GRPO {baseline * 1e3:9.3f} ms, ratio {seconds / baseline:.4f}",
                flush=True,
            )
    return rows


def loss_rows(shapes: str, device: str, repeats: int):
    """One row per (shape, pass, loss): ``mmpo`` and ``dmpo`` against ``clipped_pg`` medians,
    interleaved."""
    from nemo_rl.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn

    from nemo_mmpo.nemo_rl.loss import DMPOLossFn, MMPOClippedPGLossFn
    from nemo_mmpo.nemo_rl.paper_settings import PAPER_LOSS_SETTINGS

    config = ClippedPGLossConfig(name="mmpo", **PAPER_LOSS_SETTINGS)
    losses = {
        "clipped_pg": ClippedPGLossFn(config),
        "mmpo": MMPOClippedPGLossFn(config),
        "dmpo": DMPOLossFn(ClippedPGLossConfig(name="dmpo", **PAPER_LOSS_SETTINGS)),
    }
    rows = []
    for shape in shapes.split(","):
        batch, length = (int(part) for part in shape.split("x"))
        inputs = bench_loss.make_batch(batch, length, device)
        attach_dmpo_terms(inputs[1])  # the other losses ignore the two keys
        for backward in (False, True):

            def run(loss_fn, backward=backward, inputs=inputs):
                logprobs, data, valid_seqs, valid_toks = inputs
                logprobs = logprobs.detach().requires_grad_(backward)
                loss, _ = loss_fn(logprobs, data, valid_seqs, valid_toks)
                if backward:
                    loss.backward()

            for loss_fn in losses.values():
                run(loss_fn)
            samples = {name: [] for name in losses}
            for repeat in range(repeats):
                order = list(losses) if repeat % 2 == 0 else list(losses)[::-1]
                for name in order:
                    samples[name].append(bench_loss.timed(lambda f=losses[name]: run(f), device))
            theirs = statistics.median(samples["clipped_pg"])
            label = "forward+backward" if backward else "forward"
            for name in ("mmpo", "dmpo"):
                ours = statistics.median(samples[name])
                rows.append(
                    {
                        "shape": shape,
                        "paper_shape": shape == LOSS_SHAPES.split(",")[0],
                        "pass": label,
                        "loss": name,
                        "seconds": ours,
                        "baseline": "nemo_rl ClippedPGLossFn",
                        "baseline_seconds": theirs,
                        "ratio": ours / theirs,
                    }
                )
                print(
                    f"loss {shape:>8} {label:>16}: {name} {ours * 1e3:8.3f} ms,"
                    f" clipped_pg {theirs * 1e3:8.3f} ms, ratio {ours / theirs:.3f}",
                    flush=True,
                )
    return rows


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    return "cpu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", default=ESTIMATOR_SIZES, help="PROMPTSxGROUP, comma list")
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--shapes", default=LOSS_SHAPES, help="BATCHxSEQ_LEN, comma list")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--budget", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args()
    gpu_standins.install_import_answers()
    start = time.perf_counter()
    result = {
        "device": device_name(args.device),
        "torch": torch.__version__,
        "estimators": estimator_rows(
            args.sizes, args.prompt_len, args.device, args.repeats, args.budget
        ),
        "loss": loss_rows(args.shapes, args.device, args.repeats),
    }
    result["wall_seconds"] = time.perf_counter() - start
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} ({result['wall_seconds']:.1f} s)")


if __name__ == "__main__":
    main()
