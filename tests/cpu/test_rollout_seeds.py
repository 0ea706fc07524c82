"""``cpu_backend.seeded_rollouts``: the vLLM worker's ``generate`` with one seed per request
(``nemo_mmpo/cpu/answers/vllm_shims.py``), on a stand-in of NeMo-RL's worker (its
``generate`` builds one ``SamplingParams`` and calls ``self.llm.generate``, as
``vllm_worker.py:932`` on main). That vLLM's CPU build honours the seeds is checked by the
runs themselves: ``test_tiny_run_megatron.py``'s resumed step equals the uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nemo_mmpo.cpu.answers.vllm_shims import (
    ROLLOUT_SEED_KEY,
    ROW_SAMPLER_KEY,
    _with_per_request_parameters,
    rollout_seed,
)
from nemo_mmpo.cpu.rig.rig_settings import TinySettings, unread_cpu_settings


@dataclass
class Parameters:  # vLLM's SamplingParams, as NeMo-RL's worker builds it
    temperature: float
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None


@dataclass
class Engine:  # vLLM's LLM: what generate was asked
    calls: list = field(default_factory=list)

    def generate(self, prompts: list, parameters: Any, use_tqdm: bool = False) -> list:
        self.calls.append((prompts, parameters))
        return []


class Worker:  # NeMo-RL's VllmGenerationWorker.generate, reduced to what the shim meets
    SamplingParams = Parameters

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg, self.llm = cfg, Engine()

    def generate(self, data: dict[str, Any], greedy: bool = False) -> list:
        parameters = self.SamplingParams(temperature=0.7, max_tokens=16)
        prompts = [{"prompt_token_ids": ids} for ids in data["input_ids"]]
        return self.llm.generate(prompts, parameters, use_tqdm=False)


generate = _with_per_request_parameters(Worker.generate)
A, B = [5, 6, 7], [5, 6, 8]


def asked(worker: Worker, rows: list[list[int]], **data: Any) -> list:
    engine = worker.llm
    generate(worker, {"input_ids": rows, **data})
    assert worker.llm is engine and worker.SamplingParams is Parameters  # restored
    return engine.calls[-1][1]


def test_each_rollout_is_seeded_by_the_seed_its_prompt_and_its_copy():
    worker = Worker({ROLLOUT_SEED_KEY: 3})
    first = asked(worker, [A, B, A, A, B])
    assert [p.seed for p in first] == [
        rollout_seed(3, A, 0),
        rollout_seed(3, B, 0),
        rollout_seed(3, A, 1),
        rollout_seed(3, A, 2),
        rollout_seed(3, B, 1),
    ]
    assert len({p.seed for p in first}) == 5  # each copy its own draws
    assert all(p.temperature == 0.7 and p.max_tokens == 16 for p in first)  # NeMo-RL's
    # a later call (a fresh engine: a resumed run) seeds the same prompts alike, whatever came
    # before and wherever the prompt sits in the call
    again = asked(Worker({ROLLOUT_SEED_KEY: 3}), [B, A])
    assert [p.seed for p in again] == [rollout_seed(3, B, 0), rollout_seed(3, A, 0)]
    assert asked(Worker({ROLLOUT_SEED_KEY: 4}), [A])[0].seed != first[0].seed  # the run's seed
    assert 0 <= max(p.seed for p in first) < 2**63


def test_without_the_setting_nemo_rls_parameters_go_to_vllm_unchanged():
    worker = Worker({})
    generate(worker, {"input_ids": [A, A]})
    ((_, parameters),) = worker.llm.calls
    assert parameters == Parameters(temperature=0.7, max_tokens=16)  # one set, no seed


def test_rows_with_their_own_sampler_keep_their_seeds():
    rows = [
        {"temperature": 0.3, "top_p": 0.95, "max_new_tokens": 5, "seed": 11},
        {"temperature": 0.3, "top_p": 0.95, "max_new_tokens": 5, "seed": 12},
    ]
    parameters = asked(Worker({ROLLOUT_SEED_KEY: 3}), [A, A], **{ROW_SAMPLER_KEY: rows})
    assert [(p.seed, p.temperature, p.max_tokens) for p in parameters] == [
        (11, 0.3, 5),
        (12, 0.3, 5),
    ]


def test_the_setting_is_read_by_the_vllm_engine_of_a_synchronous_run_only():
    section = {"engine": "vllm", "seeded_rollouts": True, "seed": 5}
    assert TinySettings.from_config(section).rollout_seed() == 5
    assert TinySettings.from_config(dict(section, seeded_rollouts=False)).rollout_seed() is None
    assert not unread_cpu_settings(section, asynchronous=False)
    (unread,) = unread_cpu_settings(section, asynchronous=True)
    assert "cpu_backend.seeded_rollouts=True is not read" in unread
    transformers = dict(section, engine="transformers")
    assert TinySettings.from_config(transformers).rollout_seed() is None
    (unread,) = unread_cpu_settings(transformers, asynchronous=False)
    assert "with cpu_backend.engine=transformers" in unread
