"""Time the mmpo loss against NeMo-RL's ``ClippedPGLossFn`` with the same settings, one run.

Both losses get the same micro-batch (``[batch, seq_len]`` log-probabilities with a backward
pass through them) and the paper's ``loss_fn`` (eps 0.2, no KL). ``MMPOClippedPGLossFn`` is
NeMo-RL's loss (its ``mmpo/`` advantage metrics are computed once per step by the estimator,
see ``bench_estimators.py``'s adapter row), so the ratio is what ``loss_fn.name: mmpo`` costs.
Printed as ``mmpo / clipped_pg`` (target: at most 1.03), forward and forward+backward, medians
of interleaved repeats. Needs NeMo-RL importable (``scripts/test_nemo_rl.sh`` builds such an
environment): ``PYTHONPATH=.nemo-rl/nemo-rl-v0.7.0:. .venv-nemo-rl/bin/python
benchmarks/bench_loss.py [--device cuda] [--shapes 8x2048,4x8192]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def make_batch(batch: int, length: int, device: str, seed: int = 0):
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    generator = torch.Generator().manual_seed(seed)
    previous = -torch.rand(batch, length, generator=generator)
    current = previous[:, 1:] + 0.1 * torch.randn(batch, length - 1, generator=generator)
    advantages = torch.randn(batch, 1, generator=generator).expand(batch, length).contiguous()
    token_mask = (torch.rand(batch, length, generator=generator) < 0.9).float()
    data = BatchedDataDict(
        {
            "input_ids": torch.zeros(batch, length, dtype=torch.long),
            "advantages": advantages,
            "prev_logprobs": previous,
            "generation_logprobs": previous,
            "reference_policy_logprobs": previous,
            "token_mask": token_mask,
            "sample_mask": torch.ones(batch),
        }
    ).to(device)
    valid_tokens = (token_mask[:, 1:]).sum().to(device)
    return current.to(device), data, torch.tensor(float(batch), device=device), valid_tokens


def timed(function, device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    function()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    from nemo_rl.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn

    from nemo_mmpo.nemo_rl.loss import MMPOClippedPGLossFn
    from nemo_mmpo.nemo_rl.paper_settings import PAPER_LOSS_SETTINGS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="8x2048,4x8192", help="comma list of BATCHxSEQ_LEN")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=41)
    args = parser.parse_args()
    config = ClippedPGLossConfig(name="mmpo", **PAPER_LOSS_SETTINGS)
    losses = {"clipped_pg": ClippedPGLossFn(config), "mmpo": MMPOClippedPGLossFn(config)}
    print(f"device={args.device} torch={torch.__version__} threads={torch.get_num_threads()}")
    print(
        f"{'shape':>10} {'pass':>17} {'clipped_pg ms':>14} {'mmpo ms':>9} {'mmpo/clipped_pg':>16}"
    )
    for shape in args.shapes.split(","):
        batch, length = (int(part) for part in shape.lower().split("x"))
        current, data, seqs, toks = make_batch(batch, length, args.device)
        for backward in (False, True):

            def run(loss_fn, backward=backward, inputs=(current, data, seqs, toks)):
                logprobs, batch_data, valid_seqs, valid_toks = inputs
                logprobs = logprobs.detach().requires_grad_(backward)
                loss, _ = loss_fn(logprobs, batch_data, valid_seqs, valid_toks)
                if backward:
                    loss.backward()

            samples = {name: [] for name in losses}
            for loss_fn in losses.values():  # warm-up
                run(loss_fn)
            for repeat in range(args.repeats):  # interleaved, alternating order
                names = list(losses) if repeat % 2 == 0 else list(losses)[::-1]
                for name in names:
                    samples[name].append(timed(lambda f=losses[name]: run(f), args.device))
            theirs = statistics.median(samples["clipped_pg"])
            ours = statistics.median(samples["mmpo"])
            label = "forward+backward" if backward else "forward"
            print(
                f"{shape:>10} {label:>17} {theirs * 1e3:14.3f} {ours * 1e3:9.3f}"
                f" {ours / theirs:16.3f}"
            )


if __name__ == "__main__":
    main()
