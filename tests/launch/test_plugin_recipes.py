"""``--dry-run`` of a recipe that names its own objectives (``nemo_mmpo.plugins``): the plug-in
beside the recipe is imported before the recipe is checked, so its names and options are checked
like ours; a bad plug-in stops the dry run in one line naming it (each run a fresh process: the
registry is a process's)."""

from __future__ import annotations

import sys
from pathlib import Path

import patience
import pytest
from nemo_rl_support import nemo_rl_checkout

ROOT = Path(__file__).resolve().parents[2]
ENTRY_POINT = ROOT / "examples" / "run_mmpo_math.py"
EXAMPLE = ROOT / "examples" / "my_objectives_tiny_cpu.yaml"

RECIPE = """\
defaults: nemo_mmpo/mmpo_tiny_cpu.yaml
nemo_mmpo:
  plugins: [{module}]
grpo:
  adv_estimator:
    name: {estimator}
"""


@pytest.fixture(autouse=True)
def checkout():
    return nemo_rl_checkout()


def dry_run(recipe: Path, *overrides: str, cwd: Path | None = None):
    return patience.run(
        [sys.executable, str(ENTRY_POINT), "--config", str(recipe), "--dry-run", *overrides],
        capture_output=True,
        text=True,
        timeout=patience.COMMAND_S,
        cwd=cwd,
    )


def test_the_documented_example_dry_runs_with_its_plugins(tmp_path):
    result = dry_run(EXAMPLE, cwd=tmp_path)  # from another folder: the plug-in is the recipe's
    assert result.returncode == 0, result.stderr
    assert "clipped_weight_mmpo" in result.stdout and "entropy_bonus_pg" in result.stdout
    assert sorted(path.name for path in tmp_path.iterdir()) == []  # a dry run writes nothing


def test_a_plugin_option_is_typed_by_the_dry_run():
    result = dry_run(EXAMPLE, "grpo.adv_estimator.weight_cap=lots")
    assert result.returncode == 2 and "grpo.adv_estimator.weight_cap" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("plugin", "estimator", "fragment"),
    [
        (
            "from nemo_mmpo import register_estimator\n"
            '@register_estimator("grpo")\n'
            "def mine(groups, objective):\n    return groups.rewards\n",
            "mmpo",
            "plug-in bad_objectives: register_estimator('grpo') from bad_objectives: 'grpo' is "
            "NeMo-RL's own estimator",
        ),
        (
            "raise RuntimeError('broken on purpose')\n",
            "mmpo",
            "plug-in bad_objectives: importing it failed: RuntimeError: broken on purpose",
        ),
        (None, "mmpo", "no module named 'bad_objectives' beside the recipe"),
    ],
    ids=["shadows_grpo", "raises", "missing"],
)
def test_a_bad_plugin_stops_the_dry_run_in_one_line(tmp_path, plugin, estimator, fragment):
    if plugin is not None:
        (tmp_path / "bad_objectives.py").write_text(plugin)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(module="bad_objectives", estimator=estimator))
    result = dry_run(recipe)
    assert result.returncode == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
