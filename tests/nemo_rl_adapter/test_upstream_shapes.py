"""Shapes NeMo-RL main could take under which ``install()`` passed its checks while training
differed without a word (issue 69), each applied to a copy of main and run in a fresh
interpreter: trained correctly or refused in one line.

- an estimator factory whose first line fails on the clash probe's minimal config, whatever the
  name: every name then failed alike, and an estimator NeMo-RL learns under one of our names
  went unseen (``install()`` asks again on NeMo-RL's own default config, and refuses where the
  factory never reaches the name);
- #3773's single-controller builder importing the factory from a module nemo-mmpo does not
  hook: refused (in the same copy: one interpreter for both refusals);
- ``grpo.async_grpo.overlap_validation`` with ``evaluation.in_loop``: refused.

The advantage-clip keys renamed in NeMo-RL's ``GRPOConfig`` (our warning read the old keys) and
row validity passed as ``sample_mask=`` (our estimator read ``valid_mask`` only) are read from
NeMo-RL's config model and its GRPO estimator's signature: checked on #3773's copy in
``test_single_controller_3773.py``. The first-step outcome shapes are
``test_first_step_outcomes.py`` and ``test_advantage_result.py``.
"""

from __future__ import annotations

import pytest
from nemo_rl_copies import INSTALL, edit, nemo_rl_copy, run_in, single_controller_builder_3773
from nemo_rl_support import import_nemo_rl

pytestmark = [pytest.mark.nemo_rl, pytest.mark.main_snapshot]
grpo = import_nemo_rl("nemo_rl.algorithms.grpo")
if not hasattr(grpo, "GRPOConfig") or not hasattr(grpo.GRPOConfig, "model_fields"):
    pytest.skip("v0.7.0: these shapes are applied to main's files", allow_module_level=True)

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.nemo_rl import wrappers
from nemo_mmpo.nemo_rl.contract import UNKNOWN_NAME, estimator_clashes
from nemo_mmpo.nemo_rl.hooks import SUPPORTED

FACTORY_START = "    grpo_config = master_config.grpo\n    loss_config = master_config.loss_fn\n"
#: main's factory as a release could change it: a first line that needs the full config
#: (the probe's minimal config has no ``policy``), and an estimator under one of our names
FAILS_FIRST = FACTORY_START + '    _ = master_config.policy["max_total_sequence_length"]\n'
KNOWS_MAXRL = (
    '    elif adv_estimator_name == "maxrl":\n        raise NotImplementedError\n'
    '    elif adv_estimator_name == "grpo":'
)


def test_a_factory_failing_before_it_reads_the_name_is_probed_on_nemo_rls_default_config(
    tmp_path,
):
    """The probe's shape, and #3773's builder reaching an unhooked factory, in one copy."""
    algorithms = nemo_rl_copy(tmp_path)
    edit(algorithms / "grpo.py", FACTORY_START, FAILS_FIRST)
    edit(algorithms / "grpo.py", '    elif adv_estimator_name == "grpo":', KNOWS_MAXRL)
    single_controller_builder_3773(
        algorithms,
        "def _build_advantage_estimator(master_config):\n"
        "    from nemo_rl.algorithms.advantage_estimator import _create_advantage_estimator\n\n"
        "    return _create_advantage_estimator(master_config)\n",
    )
    probe = """
from nemo_rl.algorithms import grpo
from nemo_mmpo.nemo_rl import hooks
from nemo_mmpo.nemo_rl.contract import estimator_clashes

factory = grpo._create_advantage_estimator
print("MMPO:", estimator_clashes(factory, ["mmpo"], hooks._nemo_rl_default_config))
print("MINIMAL:", estimator_clashes(factory, ["maxrl"]))
"""
    result = run_in(tmp_path, INSTALL + probe)
    output = result.stdout + result.stderr
    assert "REFUSED:" in result.stdout, output
    refusal = result.stdout.split("REFUSED:")[1].splitlines()[0]
    assert SUPPORTED in refusal and "installed: False" in refusal
    assert (
        "nemo_rl.algorithms.grpo._create_advantage_estimator, asked for estimator 'maxrl' on "
        "NeMo-RL's examples/configs/grpo_math_1B.yaml, answers NotImplementedError"
    ) in refusal, refusal
    assert (
        "nemo_rl.algorithms.single_controller_utils.setup._build_advantage_estimator imports "
        "_create_advantage_estimator from nemo_rl.algorithms.advantage_estimator, where "
        "nemo-mmpo does not hook it"
    ) in refusal, refusal
    # a name NeMo-RL does not know is no clash on the full config either (nothing over-refused)
    assert "MMPO: {}" in result.stdout, output
    # on the minimal config alone the factory is blind, and said to be
    (minimal,) = [line for line in result.stdout.splitlines() if line.startswith("MINIMAL:")]
    assert "AttributeError('policy'), an error that does not name it" in minimal, minimal


def test_a_factory_that_never_reaches_the_name_is_refused():
    """Blind on the minimal config and on the default one: no name can be checked."""

    def factory(master_config):
        raise KeyError("policy")

    def default_config():
        return (lambda name: {"grpo": {"adv_estimator": {"name": name}}}), "a full config"

    found = estimator_clashes(factory, ["mmpo", "maxrl"], default_config)
    assert list(found) == [""]
    assert found[""] == (
        f"answers the probe's unknown estimator name {UNKNOWN_NAME!r} with KeyError(\"'policy'\") "
        "and KeyError(\"'policy'\"), an error that does not name it, on a minimal config and on "
        "NeMo-RL's a full config: it fails before it reads the name, so nemo-mmpo cannot check "
        "that NeMo-RL builds nothing under mmpo, maxrl"
    )


def test_overlapped_validation_with_in_loop_evaluation_is_refused_before_step_one():
    def async_grpo_train(policy, loss_fn, master_config):
        raise AssertionError("refused before NeMo-RL's trainer runs")

    async_grpo_train.__module__ = grpo.__name__
    train = wrappers.grpo_trainer(async_grpo_train)
    evaluation = {"enabled": True, "in_loop": True, "benchmarks": {"aime24": None}}
    config = {
        "grpo": {"async_grpo": {"enabled": True, "overlap_validation": True}},
        "loss_fn": {"name": "mmpo"},
        "evaluation": evaluation,
    }
    with pytest.raises(MMPOInputError) as error:
        train(None, None, config)
    message = str(error.value)
    assert "\n" not in message and message.startswith(
        "evaluation.in_loop=true with grpo.async_grpo.overlap_validation=true: NeMo-RL "
    )
    assert "async_grpo_train would run the hooked validate" in message
