"""NeMo-RL's merged #3773 (``feat(sc): support PPO in single controller``): the single
controller's ``setup.py`` no longer imports ``_create_advantage_estimator``; its
``_build_advantage_estimator`` imports grpo's (or, for a PPO run, ppo's) inside its body
(:data:`nemo_rl_copies.SINGLE_CONTROLLER_BUILDER`, read from NeMo-RL's public files).

On such a NeMo-RL a hook required in ``setup.py`` refused every trainer, and an optional one
let the single controller build through grpo's plain hook: no streaming chunks (so no
``mmpo/`` metrics combined over the controller's chunks), DMPO not refused. Here, on copies of
main changed that way, in a fresh interpreter: ``install()`` follows the factory into the
function that imports it, and the single controller gets its own estimator (streaming, DMPO
refused) while grpo's trainers keep theirs; a setup that reaches no factory at all is refused
in one line (a builder importing the factory from a module nemo-mmpo does not hook:
``test_upstream_shapes.py``). The same copy also renames the advantage-clip keys and has
NeMo-RL's GRPO estimator take row validity as ``sample_mask`` (issue 69's list, one copy for
the three: a fresh interpreter each costs CI seconds): the controller's estimator warns about
the renamed keys and reads ``sample_mask``.
The single controller's training run on this shape is
``tests/cpu/test_tiny_run_single_controller.py``'s.
"""

from __future__ import annotations

import importlib.util

import pytest
from nemo_rl_copies import (
    INSTALL,
    ROOT,
    nemo_rl_copy,
    renamed_clip_keys,
    run_in,
    sample_mask_keyword,
    single_controller_builder_3773,
)
from nemo_rl_support import import_nemo_rl

pytestmark = [pytest.mark.nemo_rl, pytest.mark.main_snapshot]
import_nemo_rl("nemo_rl.algorithms.grpo")
if importlib.util.find_spec("nemo_rl.algorithms.single_controller") is None:
    pytest.skip("this NeMo-RL has no single controller (v0.7.0)", allow_module_level=True)
import_nemo_rl("nemo_rl.algorithms.single_controller_utils.setup")

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.nemo_rl import wrappers
from nemo_mmpo.nemo_rl.hooks import SUPPORTED

SETUP = "nemo_rl.algorithms.single_controller_utils.setup"

#: after install(): the single controller's estimator (its clip warning, its row mask under
#: NeMo-RL's keyword), grpo's own, DMPO's and PPO's refusals
BUILD = (
    INSTALL
    + f"""
import sys
import torch
sys.path.insert(0, {str(ROOT / "tests")!r})
from nemo_rl_support import master_config_from_recipe
from nemo_rl.algorithms import grpo
from nemo_rl.algorithms.single_controller_utils import setup
from nemo_mmpo.errors import MMPOInputError

class Config(dict):  # a section read both ways, as NeMo-RL reads it
    __getattr__ = dict.__getitem__


config = master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml", ["+grpo.adv_clip_min=-1.0"])
controller = setup._build_advantage_estimator(config)
plain = grpo._create_advantage_estimator(config)
for label, built in (("CONTROLLER", controller), ("GRPO", plain)):
    print(label + ":", type(built).__name__, getattr(built, "streaming_chunks", None))
print("KEYWORDS:", " ".join(controller.row_mask_keywords))
prompts = torch.tensor([[1], [1], [1], [1], [2], [2], [2], [2]])
rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
mask, valid = torch.ones(8, 3), torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
theirs, ours, none = (
    getattr(result, "advantages", result)
    for result in (
        controller.compute_advantage(prompts, rewards, mask, sample_mask=valid),
        controller.compute_advantage(prompts, rewards, mask, valid_mask=valid),
        controller.compute_advantage(prompts, rewards, mask),
    )
)
print("SAMPLE_MASK_READ:", torch.equal(theirs, ours), not torch.equal(theirs, none))
for label, config in (
    ("DMPO", master_config_from_recipe("dmpo_math_qwen3_1.7b.yaml")),
    ("PPO", Config(ppo=Config(adv_estimator=Config(name="mmpo")), loss_fn=None)),
):
    try:
        setup._build_advantage_estimator(config)
        print(label + ": built")
    except MMPOInputError as error:
        print(label + ":", error)
"""
)


def refusal_of(result) -> str:
    output = result.stdout + result.stderr
    assert "REFUSED:" in result.stdout, output
    refusal = result.stdout.split("REFUSED:")[1].strip()
    assert "\n" not in refusal and SUPPORTED in refusal and "installed: False" in refusal
    return refusal


def test_the_hook_follows_the_factory_into_the_builder_that_imports_it(tmp_path):
    algorithms = nemo_rl_copy(tmp_path)
    single_controller_builder_3773(algorithms)
    renamed_clip_keys(algorithms)
    sample_mask_keyword(algorithms)
    result = run_in(tmp_path, BUILD)
    output = result.stdout + result.stderr
    assert "HOOKED:" in result.stdout, output
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    hooked = lines["HOOKED"].split()
    assert f"{SETUP}._build_advantage_estimator" in hooked
    assert f"{SETUP}._create_advantage_estimator" not in hooked  # setup.py has no such name
    assert f"{SETUP}.ClippedPGLossFn" in hooked
    # the controller's estimator streams its chunks; grpo_train's, built outside, does not
    assert lines["CONTROLLER"] == "MMPOAdvantageEstimator True", output
    assert lines["GRPO"] == "MMPOAdvantageEstimator False", output
    assert "dmpo cannot train in NeMo-RL's single controller" in lines["DMPO"], output
    assert lines["PPO"].startswith("ppo.adv_estimator.name=mmpo: "), output
    # the renamed clip key, read from NeMo-RL's GRPOConfig; sample_mask read as row validity
    assert "[nemo-mmpo] warning: grpo.adv_clip_min=-1.0: NeMo-RL clamps the advantages" in (
        result.stdout
    ), output
    assert lines["KEYWORDS"] == "valid_mask sample_mask", output
    assert lines["SAMPLE_MASK_READ"] == "True True", output


def test_a_setup_that_reaches_no_factory_is_refused(tmp_path):
    """NeMo-RL's estimator built in setup.py itself: no factory nemo-mmpo could hook."""
    single_controller_builder_3773(
        nemo_rl_copy(tmp_path),
        "def _build_advantage_estimator(master_config):\n"
        "    from nemo_rl.algorithms.advantage_estimator import GRPOAdvantageEstimator\n\n"
        "    return GRPOAdvantageEstimator(master_config.grpo.adv_estimator, None)\n",
    )
    refusal = refusal_of(run_in(tmp_path))
    assert (
        f"{SETUP} has no attribute '_create_advantage_estimator', and none of its functions "
        "imports it"
    ) in refusal, refusal


def test_a_builder_that_does_not_return_the_controllers_estimator_stops_in_one_line():
    """Whatever a builder reaches, our name must come back as our streaming estimator."""

    def _build_advantage_estimator(master_config):
        return object()

    config = {"grpo": {"adv_estimator": {"name": "mmpo"}}}
    with pytest.raises(MMPOInputError) as error:
        wrappers.single_controller_builder(_build_advantage_estimator)(config)
    message = str(error.value)
    assert "\n" not in message and message.startswith("grpo.adv_estimator.name=mmpo: NeMo-RL ")
    assert "single controller (run_grpo_single_controller.py) built builtins.object" in message
    theirs = {"grpo": {"adv_estimator": {"name": "grpo"}}}  # NeMo-RL's names: its own business
    assert type(wrappers.single_controller_builder(_build_advantage_estimator)(theirs)) is object
