"""Copies of the imported NeMo-RL, changed as a release could change it, and ``install()`` run
against a copy in a fresh interpreter. NeMo-RL's files are never edited: a copy lives in a
temporary folder and is changed there by text replacements."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import patience
import pytest

ROOT = Path(__file__).resolve().parents[1]

INSTALL = (
    "from nemo_mmpo.nemo_rl import install, is_installed\n"
    "try:\n"
    "    print('HOOKED:', ' '.join(install()))\n"
    "except RuntimeError as error:\n"
    "    print('REFUSED:', error, '| installed:', is_installed())\n"
)


def nemo_rl_copy(into: Path) -> Path:
    """A copy of the imported NeMo-RL's package under ``into`` (its parent goes on the path);
    returns its ``algorithms`` folder."""
    import nemo_rl

    shutil.copytree(Path(nemo_rl.__file__).resolve().parent, into / "nemo_rl")  # bytecode too
    return into / "nemo_rl" / "algorithms"


def edit(path: Path, old: str, new: str) -> None:
    """Replace the one occurrence of ``old`` in ``path``."""
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


def substitute(path: Path, pattern: str, replacement: str, at_least: int = 1) -> None:
    """``re.sub`` over ``path`` (multi-line), which must match ``at_least`` times."""
    text, count = re.subn(pattern, replacement, path.read_text(), flags=re.MULTILINE)
    assert count >= at_least, (path, pattern, count)
    path.write_text(text)


def append(path: Path, code: str) -> None:
    path.write_text(path.read_text() + "\n\n" + code)


def run_in(nemo_rl_root: Path, code: str = INSTALL) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter that imports NeMo-RL from the copy ``nemo_rl_root``."""
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(nemo_rl_root), str(ROOT)]))
    return patience.run(
        [sys.executable, "-W", "ignore", "-c", code],
        capture_output=True,
        text=True,
        env=environment,
        timeout=patience.COMMAND_S,
    )


#: NeMo-RL #3773 as merged (``feat(sc): support PPO in single controller``; setup.py and
#: config.py read at NeMo-RL commit 44e17198 with the search tools): the single controller's
#: ``setup.py`` no longer imports ``_create_advantage_estimator``; ``setup_single_controller``
#: calls ``_build_advantage_estimator(master_config)``, which imports ppo's factory for a PPO
#: run (``is_ppo_run``: a ``ppo`` block in the config) and grpo's otherwise, inside its body.
SINGLE_CONTROLLER_BUILDER = '''\
def _build_advantage_estimator(master_config: MasterConfig) -> Any:
    """Build the advantage estimator from whichever algorithm's factory applies."""
    if is_ppo_run(master_config):
        from nemo_rl.algorithms.ppo import _create_advantage_estimator

        return _create_advantage_estimator(cast(PPOMasterConfig, master_config))
    else:
        from nemo_rl.algorithms.grpo import _create_advantage_estimator

        return _create_advantage_estimator(cast(GrpoMasterConfig, master_config))
'''
IS_PPO_RUN = """\
def is_ppo_run(master_config: MasterConfig) -> bool:
    return getattr(master_config, "ppo", None) is not None
"""


def single_controller_builder_3773(algorithms: Path, builder: str = SINGLE_CONTROLLER_BUILDER):
    """The copy's single-controller setup (``algorithms``: :func:`nemo_rl_copy`'s folder)
    changed as #3773 changed it: the estimator built by ``builder`` (#3773's
    ``_build_advantage_estimator`` unless a test passes another), NeMo-RL main's other code
    as it is. Returns the changed ``setup.py``."""
    folder = algorithms / "single_controller_utils"
    setup = folder / "setup.py"
    edit(setup, "    _create_advantage_estimator,\n", "")
    substitute(
        setup,
        r"advantage_estimator = _create_advantage_estimator\(\s*cast\(GrpoMasterConfig, "
        r"master_config\)\s*\)",
        "advantage_estimator = _build_advantage_estimator(master_config)",
    )
    edit(
        setup,
        "from nemo_rl.algorithms.grpo import MasterConfig as GrpoMasterConfig\n",
        "from nemo_rl.algorithms.grpo import MasterConfig as GrpoMasterConfig\n"
        "from nemo_rl.algorithms.ppo import MasterConfig as PPOMasterConfig\n"
        "from nemo_rl.algorithms.single_controller_utils.config import is_ppo_run\n",
    )
    append(folder / "config.py", IS_PPO_RUN)
    append(setup, builder)
    return setup


def load_changed(module, change, monkeypatch):
    """``module`` (imported) with ``change(source)`` applied, run in this process as the module
    of that name: in ``sys.modules`` while the test runs (``monkeypatch`` restores the original),
    so ``install()`` hooks the changed one. Cheaper than a copy and a fresh interpreter where the
    change is to one module's functions."""
    import importlib.util

    source = Path(module.__file__).read_text()
    spec = importlib.util.spec_from_loader(module.__name__, loader=None, origin=module.__file__)
    changed = importlib.util.module_from_spec(spec)
    changed.__file__ = module.__file__
    monkeypatch.setitem(sys.modules, module.__name__, changed)
    code = compile(change(source), module.__file__, "exec", dont_inherit=True)
    exec(code, changed.__dict__)
    return changed


def metrics_argument(source: str, expression: str) -> str:
    """``grpo.py``'s ``source`` with ``grpo_train`` handing its metrics hook
    (``_log_mixed_rewards_and_advantages_information``) ``expression`` for the step's
    ``metrics``; ``expression`` may read ``metrics``."""
    changed, count = re.subn(
        r"(_log_mixed_rewards_and_advantages_information\(\s*logger=logger,\s*"
        r"total_steps=total_steps,\s*)metrics=metrics,",
        lambda match: f"{match.group(1)}metrics={expression},",
        source,
    )
    assert count == 1  # grpo_train's (async_grpo_train reads the estimator's last_metrics)
    return changed


@pytest.fixture
def forget_new_modules():
    """NeMo-RL's modules first imported during the test (against a changed module
    :func:`load_changed` put in their place) forgotten after it."""
    imported_before = set(sys.modules)
    yield
    for name in set(sys.modules) - imported_before:
        if name.startswith("nemo_rl."):
            del sys.modules[name]


def renamed_clip_keys(algorithms: Path) -> None:
    """The copy's ``grpo.advantage_clip_low``/``_high`` renamed ``adv_clip_min``/``_max`` (its
    ``GRPOConfig`` and every reader), as a release could rename them."""
    substitute(algorithms / "grpo.py", r"\badvantage_clip_low\b", "adv_clip_min", at_least=2)
    substitute(algorithms / "grpo.py", r"\badvantage_clip_high\b", "adv_clip_max", at_least=2)


def sample_mask_keyword(algorithms: Path) -> None:
    """The copy's GRPO estimator takes row validity as ``sample_mask`` (#3837 under another
    name); its other estimators are left alone."""
    estimators = algorithms / "advantage_estimator.py"
    grpo_part, rest = estimators.read_text().split("class GDPOAdvantageEstimator", 1)
    signature = "def compute_advantage(self, prompt_ids, rewards, mask, **kwargs):"
    assert grpo_part.count(signature) == 1
    grpo_part = grpo_part.replace(
        signature,
        "def compute_advantage(self, prompt_ids, rewards, mask, sample_mask=None, **kwargs):",
    )
    estimators.write_text(grpo_part + "class GDPOAdvantageEstimator" + rest)
