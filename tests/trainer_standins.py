"""Stand-ins for the GPU parts of NeMo-RL's GRPO loop (written here, not taken from NeMo-RL).

NeMo-RL's real ``grpo_train`` / ``async_grpo_train`` / ``grpo_train_sync`` drive these objects:

- :func:`char_tokenizer`: a real fast tokenizer, one token per character (no hub download;
  the tiny CPU run's, from :mod:`nemo_mmpo.cpu.rig.model`);
- :class:`StandInPolicy`: log-probs from a fixed function of the tokens; ``train`` calls the
  loss function the trainer hands it on the whole batch and records inputs and outputs;
- :class:`StandInGeneration`: answers arithmetic prompts with ``\\boxed{}``, right with a
  per-prompt probability, so groups have mixed, all-pass and all-fail rewards;
- :func:`make_math_env`: a Ray actor that grades ``\\boxed{}`` answers with 0/1 rewards;
- :class:`RecordingLogger`.

Checkpoints go through NeMo-RL's own ``CheckpointManager``. Both subclass NeMo-RL's interfaces
through the CPU backends' driver-side bases (:mod:`nemo_mmpo.cpu.engines.policy`,
:mod:`nemo_mmpo.cpu.engines.generation`), whose no-ops are the calls ``grpo_train`` makes on GPU
workers.

Real prompts, real binary rewards; only model, sampler and storage are stood in for.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import torch
from nemo_rl_support import import_nemo_rl

import_nemo_rl("nemo_rl.models.policy.interfaces")  # the bases below subclass NeMo-RL's

from nemo_mmpo.cpu.engines.generation import DriverSideEngine
from nemo_mmpo.cpu.engines.policy import DriverSidePolicy
from nemo_mmpo.cpu.rig.model import EOS, PAD, char_tokenizer

__all__ = ["char_tokenizer"]  # the tests' tokenizer is the tiny CPU run's


PROBLEMS = [(a, b) for a in range(1, 9) for b in range(1, 5)]


def success_probability(index: int) -> float:
    """Problems 0, 4, 8, ... always fail, 1, 5, ... always pass, the rest are mixed."""
    return (0.0, 1.0, 0.3, 0.7)[index % 4]


def math_dataset(tokenizer: Any, size: int = 16) -> list[dict[str, Any]]:
    """``DatumSpec`` records: an arithmetic question and its ground truth."""
    records = []
    for index, (a, b) in enumerate(PROBLEMS[:size]):
        text = f"Q{index}: What is {a} + {b}? Put the answer in \\boxed{{}}."
        token_ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False))
        records.append(
            {
                "message_log": [{"role": "user", "content": text, "token_ids": token_ids}],
                "length": len(token_ids),
                "extra_env_info": {"ground_truth": str(a + b), "problem": index},
                "loss_multiplier": 1.0,
                "idx": index,
                "task_name": "math",
            }
        )
    return records


class StandInGeneration(DriverSideEngine):
    """Samples ``\\boxed{answer}`` responses; records every batch it was asked for."""

    def __init__(self, tokenizer: Any, config: dict[str, Any], seed: int = 0) -> None:
        self.tokenizer = tokenizer
        self.cfg = config
        self.random = random.Random(seed)
        self.generated_prompts: list[list[str]] = []

    def _answer(self, prompt: str) -> str:
        match = re.match(r"Q(\d+): What is (\d+) \+ (\d+)\?", prompt)
        index, a, b = (int(group) for group in match.groups())
        correct = self.random.random() < success_probability(index)
        return f"The answer is \\boxed{{{a + b if correct else a + b + 1}}}."

    def generate(self, data: Any, greedy: bool = False) -> Any:
        from nemo_rl.distributed.batched_data_dict import BatchedDataDict

        input_ids, input_lengths = data["input_ids"], data["input_lengths"]
        prompts = [
            self.tokenizer.decode(row[: int(length)], skip_special_tokens=True)
            for row, length in zip(input_ids, input_lengths, strict=True)
        ]
        self.generated_prompts.append(prompts)
        responses = [
            [*self.tokenizer.encode(self._answer(prompt), add_special_tokens=False), EOS]
            for prompt in prompts
        ]
        width = int(input_lengths.max()) + max(len(response) for response in responses)
        output_ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
        logprobs = torch.zeros(len(prompts), width)
        for row, (length, response) in enumerate(zip(input_lengths, responses, strict=True)):
            length = int(length)
            output_ids[row, :length] = input_ids[row, :length]
            output_ids[row, length : length + len(response)] = torch.tensor(response)
            logprobs[row, length : length + len(response)] = token_logprobs(torch.tensor(response))
        generation_lengths = torch.tensor([len(response) for response in responses])
        return BatchedDataDict(
            {
                "output_ids": output_ids,
                "logprobs": logprobs,
                "generation_lengths": generation_lengths,
                "unpadded_sequence_lengths": input_lengths + generation_lengths,
            }
        )

    async def generate_async(self, data: Any, greedy: bool = False) -> Any:
        """NeMo-RL's async rollouts stream ``(row index, one-row output)``."""
        outputs = self.generate(data, greedy)
        for row in range(outputs["output_ids"].shape[0]):
            yield row, outputs.slice(row, row + 1)


def token_logprobs(token_ids: torch.Tensor, version: int = 0) -> torch.Tensor:
    """A fixed log-probability per token, shifted by the policy version after each update."""
    return -0.2 - 0.05 * (token_ids % 5).float() - 0.03 * version * ((token_ids % 3) - 1).float()


class StandInPolicy(DriverSidePolicy):
    """Log-probs from :func:`token_logprobs`; ``train`` runs the given loss on the batch."""

    def __init__(self) -> None:
        self.version = 0
        self.train_calls: list[dict[str, Any]] = []
        self.saved: list[str] = []

    def _logprobs(self, data: Any, version: int) -> torch.Tensor:
        return token_logprobs(data["input_ids"], version)

    def get_logprobs(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        from nemo_rl.distributed.batched_data_dict import BatchedDataDict

        return BatchedDataDict({"logprobs": self._logprobs(data, self.version)})

    def get_reference_policy_logprobs(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        from nemo_rl.distributed.batched_data_dict import BatchedDataDict

        return BatchedDataDict({"reference_logprobs": self._logprobs(data, 0)})

    def train(
        self,
        data: Any,
        loss_fn: Any,
        eval_mode: bool = False,
        *,
        gbs: int | None = None,
        mbs: int | None = None,
        timer: Any = None,
    ) -> dict[str, Any]:
        current = self._logprobs(data, self.version + 1)[:, 1:].clone().requires_grad_(True)
        sample_mask = data["sample_mask"]
        global_valid_seqs = sample_mask.sum()
        global_valid_toks = (data["token_mask"][:, 1:] * sample_mask.unsqueeze(-1)).sum()
        loss, metrics = loss_fn(current, data, global_valid_seqs, global_valid_toks)
        loss.backward()
        self.train_calls.append(
            {
                "data": {key: data[key] for key in data},
                "loss_fn": loss_fn,
                "loss": loss.detach(),
                "metrics": metrics,
                "gradient": current.grad,
                "next_token_logprobs": current.detach(),
                "global_valid_seqs": global_valid_seqs,
                "global_valid_toks": global_valid_toks,
            }
        )
        self.version += 1
        return {
            "loss": loss.detach().reshape(1),
            "grad_norm": current.grad.norm().reshape(1),
            "all_mb_metrics": {
                **{key: [value] for key, value in metrics.items()},
                # what NeMo-RL's policy workers add to every micro-batch's metrics
                "global_valid_seqs": [float(global_valid_seqs)],
                "global_valid_toks": [float(global_valid_toks)],
                "lr": [1e-6],
            },
        }

    def save_checkpoint(self, weights_path: str, *args: Any, **kwargs: Any) -> None:
        Path(weights_path).mkdir(parents=True, exist_ok=True)
        self.saved.append(weights_path)


def make_math_env() -> Any:
    """A Ray actor grading ``\\boxed{}`` answers against ``ground_truth`` with 0/1 rewards."""
    import ray
    from nemo_rl.environments.interfaces import EnvironmentReturn

    @ray.remote(num_cpus=0)
    class BoxedAnswerEnvironment:
        def step(self, message_logs: list, metadata: list) -> Any:
            rewards, answers = [], []
            for messages, info in zip(message_logs, metadata, strict=True):
                found = re.findall(r"\\boxed\{([^}]*)\}", messages[-1]["content"])
                answer = found[-1] if found else None
                answers.append(answer)
                rewards.append(1.0 if answer == info["ground_truth"] else 0.0)
            count = len(message_logs)
            return EnvironmentReturn(
                observations=[{"role": "environment", "content": ""} for _ in range(count)],
                metadata=metadata,
                next_stop_strings=[None] * count,
                rewards=torch.tensor(rewards),
                terminateds=torch.ones(count, dtype=torch.bool),
                answers=answers,
            )

        def global_post_process_and_metrics(self, batch: Any) -> tuple[Any, dict]:
            return batch, {}

        def shutdown(self) -> None:
            return None

    return BoxedAnswerEnvironment.remote()


class RecordingLogger:
    """Keeps every metric the trainer logs: ``{prefix/name: [(step, value), ...]}``."""

    def __init__(self) -> None:
        self.metrics: dict[str, list[tuple[int, Any]]] = {}

    def log_metrics(self, metrics: dict, step: int, prefix: str = "", **kwargs: Any) -> None:
        for key, value in metrics.items():
            name = f"{prefix}/{key}" if prefix else key
            self.metrics.setdefault(name, []).append((step, value))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("log_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)
