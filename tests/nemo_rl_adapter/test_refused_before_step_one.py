"""What ``install()`` and the hooked trainers refuse before step 1, against the real NeMo-RL.

- DMPO is DMPO or refused: ``loss_fn.name: dmpo`` with another loss reaching ``grpo_train`` or
  ``async_grpo_train`` (a driver with ``install(loss=False)`` that builds NeMo-RL's
  ``ClippedPGLossFn``) stops when the trainer starts; the single controller refuses DMPO at its
  factory whatever builds the loss; the penalties hook adds DMPO's terms only inside a trainer
  training DMPO's loss;
- an optional hook a recipe needs: on a copy of NeMo-RL (one per module, one fresh interpreter)
  whose ``validate``, ``validate_sync`` and penalties hook are renamed, ``install()`` installs
  and each trainer refuses the recipe that needs the missing one (``evaluation.in_loop``, DMPO)
  before its first step, in one line; on main the copy also has the pool of advantage actors of
  NeMo-RL after our snapshot (``advantage_actor.create_advantage_actors``, simulated from its
  public signature: pull request #3837's stage at commit 122b734f, ``async_rl.
  num_advantage_workers > 0``), refused in one line for our estimators;
- every key strict on the install path: a misspelt DMPO key, ``DMPO``/``"dmpo "`` as the loss
  name, ``MMPO`` as the estimator name; NeMo-RL's advantage clipping after ours warned;
- the version floor: a NeMo-RL older than 0.6.0 is refused (main reports 0.6.0 itself);
- no clash today: NeMo-RL's own factories, called with each of our names, answer as for a name
  nobody uses (the mutated copies are ``test_install_refusals.py``).
"""

from __future__ import annotations

import json

import pytest
from nemo_rl_copies import append, nemo_rl_copy, run_in, substitute
from nemo_rl_support import import_nemo_rl, master_config_from_recipe

pytestmark = pytest.mark.nemo_rl

nemo_rl = import_nemo_rl("nemo_rl")
grpo = import_nemo_rl("nemo_rl.algorithms.grpo")
ppo = import_nemo_rl("nemo_rl.algorithms.ppo")
loss_module = import_nemo_rl("nemo_rl.algorithms.loss")

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.nemo_rl import install
from nemo_mmpo.nemo_rl.contract import (
    estimator_clashes,
    loss_clashes,
    nemo_rl_version,
    version_problem,
)
from nemo_mmpo.nemo_rl.estimator_settings import estimator_names
from nemo_mmpo.nemo_rl.hooks import MARK

DMPO_RECIPE = "dmpo_math_qwen3_1.7b.yaml"


class Config(dict):
    """A config section read both ways, as NeMo-RL's code reads it (``a.b`` and ``a["b"]``)."""

    __getattr__ = dict.__getitem__


def trainer_arguments(trainer, **given) -> dict:
    """Every required parameter of NeMo-RL's ``trainer`` (None), and ``given``: enough for its
    hook to decide before the first step (a call that gets past it fails on the Nones)."""
    import inspect

    parameters = inspect.signature(getattr(trainer, MARK)).parameters.items()
    arguments = {name: None for name, item in parameters if item.default is inspect.Parameter.empty}
    return {**arguments, **given}


def one_line(message: str) -> str:
    assert "\n" not in message and nemo_rl_version() in message, message
    return message


@pytest.mark.parametrize("trainer", ["grpo_train", "async_grpo_train"])
def test_dmpo_with_nemo_rls_loss_stops_before_step_one(trainer):
    install(loss=False)
    config = master_config_from_recipe(DMPO_RECIPE)
    their_loss = loss_module.ClippedPGLossFn(config.loss_fn)  # a driver's own, with loss=False
    train = getattr(grpo, trainer)
    with pytest.raises(MMPOInputError) as error:
        train(**trainer_arguments(train, loss_fn=their_loss, master_config=config))
    message = one_line(str(error.value))
    assert f"NeMo-RL {nemo_rl_version()}'s {trainer} is nemo_rl.algorithms.loss" in message
    assert "not DMPOLossFn" in message and "install() (loss=True)" in message


def test_dmpo_terms_only_inside_a_trainer_training_dmpos_loss():
    from nemo_mmpo.nemo_rl import wrappers

    install()
    config = master_config_from_recipe(DMPO_RECIPE)
    hook = grpo._apply_configured_message_level_advantage_penalties
    for loss in (None, loss_module.ClippedPGLossFn(config.loss_fn)):
        with pytest.raises(MMPOInputError, match="per-batch terms would not reach it"):
            if loss is None:
                hook(None, [], config)  # outside a hooked trainer
            else:
                with wrappers.training_with(loss):
                    hook(None, [], config)
    # the single controller refuses DMPO at its factory, whatever builds the loss
    try:
        from nemo_rl.algorithms.single_controller_utils import setup as single_controller
    except ModuleNotFoundError:  # v0.7.0 has no single controller
        return
    with pytest.raises(MMPOInputError, match=r"dmpo cannot train in NeMo-RL's single controller"):
        single_controller._create_advantage_estimator(config)


def test_every_key_of_ours_is_strict_on_the_install_path(capsys):
    install()
    config_type = loss_module.ClippedPGLossConfig
    for name in ("dmpo", "mmpo", "clipped_pg"):
        with pytest.raises(MMPOInputError, match=r"loss_fn.dmpo_wieght=0.5 is not a setting"):
            grpo.ClippedPGLossFn(config_type(name=name, dmpo_wieght=0.5))
    for name in ("DMPO", "dmpo "):
        with pytest.raises(MMPOInputError, match=r"did you mean 'dmpo'"):
            grpo.ClippedPGLossFn(config_type(name=name))
    assert type(grpo.ClippedPGLossFn(config_type(name="clipped_pg"))) is loss_module.ClippedPGLossFn
    misspelt = Config(grpo=Config(adv_estimator=Config(name="MMPO")), loss_fn=Config())
    with pytest.raises(MMPOInputError) as error:
        grpo._create_advantage_estimator(misspelt)
    message = one_line(str(error.value))
    assert "name='MMPO'" in message and "did you mean 'mmpo'?" in message
    assert "Invalid adv_estimator name: MMPO" in message  # NeMo-RL's own answer, quoted
    clipped = Config(
        grpo=Config(adv_estimator=Config(name="mmpo"), advantage_clip_high=1.0),
        loss_fn=Config(name="mmpo"),
    )
    grpo._create_advantage_estimator(clipped)
    assert "grpo.advantage_clip_high=1.0: NeMo-RL clamps" in capsys.readouterr().out


def test_a_nemo_rl_older_than_the_floor_is_refused(monkeypatch):
    assert version_problem(nemo_rl.__version__) is None  # 0.7.0, or main's 0.6.0
    assert version_problem("0.6.0+7ea279ab") is None
    monkeypatch.setattr(nemo_rl, "__version__", "0.5.3")
    with pytest.raises(RuntimeError) as error:
        install()
    message = str(error.value)
    assert "\n" not in message and "NeMo-RL 0.5.3 is older than 0.6.0: upgrade" in message


def test_nemo_rls_factories_build_nothing_under_our_names():
    install()
    ours = estimator_names()
    assert estimator_clashes(getattr(grpo._create_advantage_estimator, MARK), ours) == {}
    assert estimator_clashes(getattr(ppo._create_advantage_estimator, MARK), ours) == {}
    original_loss = getattr(grpo.ClippedPGLossFn, MARK)
    assert loss_clashes(original_loss, loss_module.ClippedPGLossConfig, ("mmpo", "dmpo")) == {}


# --- one copy of NeMo-RL without the optional hooks, in one fresh interpreter -----------------
SCENARIOS = """
import inspect, json
from nemo_mmpo.nemo_rl import MMPOAdvantageEstimator, install
from nemo_mmpo.nemo_rl.hooks import MARK
from nemo_mmpo.nemo_rl.loss import DMPOLossFn
results = {"hooked": install()}
import nemo_rl.algorithms.grpo as grpo
import nemo_rl.algorithms.grpo_sync as grpo_sync
from nemo_rl.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn
IN_LOOP = {"enabled": True, "in_loop": True, "benchmarks": {"aime24": None}}

def outcome(call, *args, **kwargs):
    try:
        return repr(call(*args, **kwargs))
    except Exception as error:
        return f"{type(error).__name__}: {error}"

def train(trainer, **given):
    parameters = inspect.signature(getattr(trainer, MARK)).parameters.items()
    arguments = {n: None for n, p in parameters if p.default is inspect.Parameter.empty}
    return outcome(trainer, **{**arguments, **given})

dmpo = {"loss_fn": {"name": "dmpo"}}
in_loop = {"loss_fn": {"name": "mmpo"}, "evaluation": IN_LOOP}
results["dmpo"] = train(
    grpo.grpo_train, loss_fn=DMPOLossFn(ClippedPGLossConfig(name="dmpo")), master_config=dmpo
)
results["async_in_loop"] = train(
    grpo.async_grpo_train, loss_fn=ClippedPGLossFn(ClippedPGLossConfig()), master_config=in_loop
)
results["sync_in_loop"] = train(grpo_sync.grpo_train_sync, master_config=in_loop)
try:
    from nemo_rl.algorithms.single_controller_utils import setup
except ModuleNotFoundError:
    setup = None
if setup is not None:
    pool = setup.create_advantage_actors
    ours = MMPOAdvantageEstimator({"name": "mmpo"})
    results["pool_ours"] = outcome(pool, None, None, ours, num_workers=2)
    results["pool_theirs"] = outcome(pool, None, None, "theirs", num_workers=2)
print("RESULTS:" + json.dumps(results))
"""

#: the pool of advantage actors, as NeMo-RL's ``advantage_actor.py`` declares it (a stand-in:
#: the actors themselves need its data plane)
ACTOR_POOL = '''
def create_advantage_actors(dp_config, config, advantage_estimator, *, num_workers):
    """Stand-in for NeMo-RL's pool of CPU advantage actors (commit 122b734f)."""
    return [f"actor {index} holding {advantage_estimator}" for index in range(num_workers)]
'''


@pytest.fixture(scope="module")
def without_optional_hooks(tmp_path_factory) -> dict:
    """The scenarios' outcomes on a copy whose ``validate``, ``validate_sync`` and penalties
    hook have other names (their calls too), with the actor pool where a single controller is."""
    root = tmp_path_factory.mktemp("nemo_rl_without_optional_hooks")
    algorithms = nemo_rl_copy(root)
    penalties = "_apply_configured_message_level_advantage_penalties"
    substitute(algorithms / "grpo.py", rf"\b{penalties}\(", "_apply_message_penalties(", 3)
    substitute(algorithms / "grpo.py", r"\bvalidate\(", "validate_policy(", 3)
    substitute(algorithms / "grpo_sync.py", r"\bvalidate_sync\(", "validate_data_plane(", 2)
    setup = algorithms / "single_controller_utils" / "setup.py"
    if setup.is_file():
        (algorithms / "advantage_actor.py").write_text(ACTOR_POOL)
        append(setup, "from nemo_rl.algorithms.advantage_actor import create_advantage_actors")
    result = run_in(root, SCENARIOS)
    assert "RESULTS:" in result.stdout, result.stdout + result.stderr
    return json.loads(result.stdout.split("RESULTS:")[1])


def test_install_leaves_out_missing_optional_hooks(without_optional_hooks):
    hooked = without_optional_hooks["hooked"]
    assert "nemo_rl.algorithms.grpo.grpo_train" in hooked
    assert not [name for name in hooked if name.endswith((".validate", ".validate_sync"))]


def test_a_recipe_needing_a_missing_hook_stops_before_step_one(without_optional_hooks):
    def refusal(key: str) -> str:
        outcome = without_optional_hooks[key]
        assert outcome.startswith("MMPOInputError: ") and "\n" not in outcome, outcome
        return outcome

    assert "has no _apply_configured_message_level_advantage_penalties" in refusal("dmpo")
    assert "so grpo_train would fail in its workers at step 1" in refusal("dmpo")
    for key, function in (("async_in_loop", "validate"), ("sync_in_loop", "validate_sync")):
        message = refusal(key)
        assert f"evaluation.in_loop=true: NeMo-RL {nemo_rl_version().split('+')[0]}" in message
        assert f"has no {function} that nemo-mmpo could hook" in message
        assert "set evaluation.in_loop=false" in message


def test_our_estimators_in_a_pool_of_advantage_actors_are_refused(without_optional_hooks):
    if "pool_ours" not in without_optional_hooks:
        pytest.skip("this NeMo-RL has no single controller (v0.7.0)")
    message = without_optional_hooks["pool_ours"]
    assert message.startswith("MMPOInputError: async_rl.num_advantage_workers > 0") and (
        "set async_rl.num_advantage_workers=0" in message and "\n" not in message
    )
    assert "actor 1 holding theirs" in without_optional_hooks["pool_theirs"]
