"""Ready for NeMo-RL's ``AdvantageResult`` (pull request #3512, issue #2909).

The pull request makes every estimator return ``AdvantageResult(advantages, returns=None,
metrics={})`` and the trainers read ``.advantages`` and ``.metrics``. Here a copy of this
snapshot's ``grpo.py`` is changed that way (every ``train_data["advantages"] =
adv_estimator.compute_advantage(...)`` becomes "take ``.advantages``, merge ``.metrics`` into
the step's metrics") and an ``AdvantageResult`` type is added to NeMo-RL's
``advantage_estimator`` module; the changed ``grpo_train`` then trains with ``name: mmpo``:
our estimator returns the result type, the policy trains on the core library's advantages,
and our metrics reach the logger through the result, once per step. A trainer changed to take
``.advantages`` and drop ``.metrics`` stops at the end of step 1 in one line (the first-step
outcome check). The same test run on the unchanged trainer is ``test_trainer_loop.py``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch
from nemo_rl_copies import forget_new_modules  # noqa: F401 (fixture)
from nemo_rl_support import import_nemo_rl, master_config_from_recipe

pytestmark = pytest.mark.nemo_rl
grpo = import_nemo_rl("nemo_rl.algorithms.grpo")
advantage_module = import_nemo_rl("nemo_rl.algorithms.advantage_estimator")
from test_trainer_loop import PROMPTS, TINY_RUN, run_trainer

from nemo_mmpo import compute_advantages, group_ids_from_prompt_rows
from nemo_mmpo.nemo_rl import MMPOAdvantageEstimator, install

CALL = 'train_data["advantages"] = adv_estimator.compute_advantage('


@dataclasses.dataclass
class AdvantageResult:
    """The shape of #3512's result type."""

    advantages: torch.Tensor
    returns: torch.Tensor | None = None
    metrics: dict = dataclasses.field(default_factory=dict)


def read_result(result, sink):
    """What the changed trainers do with an estimator's return value."""
    assert isinstance(result, AdvantageResult), type(result)
    sink.update(result.metrics)
    return result.advantages


def changed_source(source: str) -> str:
    """``grpo.py`` with each estimator call reading ``.advantages`` and ``.metrics``: the
    synchronous loop merges them into ``metrics``, the asynchronous one into
    ``rollout_metrics`` (the dicts each already logs)."""
    pieces, position = [], 0
    for match in re.finditer(re.escape(CALL), source):
        start = match.end()
        depth, index = 1, start
        while depth:  # the call's closing parenthesis
            depth += {"(": 1, ")": -1}.get(source[index], 0)
            index += 1
        before = source[: match.start()]
        in_async = before.rfind("def async_grpo_train(") > before.rfind("def grpo_train(")
        sink = "rollout_metrics" if in_async else "metrics"
        pieces.append(source[position : match.start()])
        pieces.append(
            f'train_data["advantages"] = _read_result(adv_estimator.compute_advantage('
            f"{source[start : index - 1]}), {sink})"
        )
        position = index
    pieces.append(source[position:])
    return "".join(pieces)


@pytest.fixture
def changed_grpo(monkeypatch, forget_new_modules):  # noqa: F811 (the imported fixture)
    """The changed trainer module, installed as ``nemo_rl.algorithms.grpo`` for the test.
    NeMo-RL modules first imported during the test (``from nemo_rl.algorithms.grpo import
    MasterConfig`` binds the changed module's classes) are forgotten afterwards, so later tests
    import them against the real trainer (on main, the async trajectory collector's
    ``isinstance`` check on the master config sees the real class again)."""
    source = Path(grpo.__file__).read_text()
    assert source.count(CALL) >= 2  # grpo_train and async_grpo_train
    spec = importlib.util.spec_from_loader(grpo.__name__, loader=None, origin=grpo.__file__)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = grpo.__file__
    module._read_result = read_result
    exec(compile(changed_source(source), grpo.__file__, "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, grpo.__name__, module)
    monkeypatch.setattr(advantage_module, "AdvantageResult", AdvantageResult, raising=False)
    return module


@pytest.mark.alternating
def test_the_changed_trainer_trains_with_mmpo_through_the_result(
    changed_grpo, ray_cluster, tmp_path, monkeypatch
):
    results = []
    original = MMPOAdvantageEstimator.compute_advantage

    def recording(self, prompt_ids, rewards, mask, *args, **kwargs):
        result = original(self, prompt_ids, rewards, mask, *args, **kwargs)
        results.append((self, prompt_ids.clone(), rewards.clone(), result, dict(self.last_metrics)))
        return result

    monkeypatch.setattr(MMPOAdvantageEstimator, "compute_advantage", recording)
    install()  # hooks the changed module, as it would the real one
    config = master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml", TINY_RUN)
    policy, logger, _ = run_trainer(changed_grpo.grpo_train, config, tmp_path)

    assert len(results) == len(policy.train_calls) == 2
    for (estimator, prompt_ids, rewards, result, last_metrics), call in zip(
        results, policy.train_calls, strict=True
    ):
        assert isinstance(result, AdvantageResult) and result.returns is None
        assert estimator.take_step_metrics() == {}  # no second channel
        expected = compute_advantages(
            rewards, group_ids_from_prompt_rows(prompt_ids), estimator.objective, "plugin"
        ).to(result.advantages.dtype)
        assert torch.equal(call["data"]["advantages"][:, 0], expected)
        assert prompt_ids.shape[0] == PROMPTS * 4
        assert result.metrics == last_metrics and "mmpo/failure_moment_4" in result.metrics
    # the metrics travelled in the result and reached the logger, once per step
    steps = logger.metrics["train/mmpo/success_rate"]
    assert [step for step, _ in steps] == [1, 2]
    assert [value for _, value in steps] == [
        pytest.approx(float(rewards.mean())) for _, _, rewards, _, _ in results
    ]


def test_without_the_result_type_the_estimator_returns_a_tensor_as_today():
    estimator = MMPOAdvantageEstimator({"name": "mmpo"})
    prompt_ids = torch.arange(4).repeat_interleave(4)[:, None]
    rewards = (torch.arange(16) % 3 == 0).float()
    output = estimator.compute_advantage(prompt_ids, rewards, torch.ones(16, 5))
    if hasattr(advantage_module, "AdvantageResult"):
        pytest.skip("this NeMo-RL already has AdvantageResult")
    assert isinstance(output, torch.Tensor) and output.shape == (16, 5)
    assert estimator.take_step_metrics() == estimator.last_metrics


def test_a_trainer_that_drops_the_results_metrics_stops_at_step_one(
    changed_grpo, ray_cluster, tmp_path, monkeypatch
):
    """#3512 landing with a trainer that takes ``.advantages`` and drops ``.metrics``: our
    estimator's metrics travel in the result only (no second channel), so none reach the
    logger; the first-step check (:mod:`nemo_mmpo.nemo_rl.outcomes`) stops the run."""
    from nemo_mmpo.errors import MMPOInputError
    from nemo_mmpo.nemo_rl.contract import nemo_rl_version

    monkeypatch.setattr(changed_grpo, "_read_result", lambda result, sink: result.advantages)
    install()
    config = master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml", TINY_RUN)
    with pytest.raises(MMPOInputError) as error:
        run_trainer(changed_grpo.grpo_train, config, tmp_path)
    message = str(error.value)
    assert "\n" not in message and message.startswith(
        f"NeMo-RL {nemo_rl_version()}'s grpo_train logged step 1's metrics with no mmpo/ "
        "metrics (grpo.adv_estimator.name=mmpo)"
    ), message
    assert not (tmp_path / "checkpoints" / "step_2").exists()
