"""docs/keys.md's tables are what the settings classes, the common recipe and the metrics say."""

from __future__ import annotations

import re

import pytest
import yaml

from nemo_mmpo.eval.protocol import EvaluationSettings
from nemo_mmpo.launch import keys
from nemo_mmpo.nemo_rl.dmpo_batch_terms import DMPOSettings
from nemo_mmpo.nemo_rl.estimator_settings import section_model
from nemo_mmpo.nemo_rl.names import NEMO_RL_ESTIMATOR_KEYS


def test_the_page_is_up_to_date():
    page = keys.DOCS_PAGE.read_text(encoding="utf-8")
    assert keys.render(page) == page, "run: python -m nemo_mmpo.launch.keys --write"
    assert keys.main(["--check"]) == 0


def test_every_key_of_the_settings_has_a_row():
    table = keys.keys_table()
    rows = set(re.findall(r"^\| `([\w.]+)` \|", table, flags=re.M))
    expected = {
        *(f"grpo.adv_estimator.{key}" for key in section_model().model_fields),
        "loss_fn.name",
        *(f"loss_fn.{key}" for key in DMPOSettings.model_fields),
        *(f"evaluation.{key}" for key in EvaluationSettings.model_fields),
    } - {f"grpo.adv_estimator.{key}" for key in NEMO_RL_ESTIMATOR_KEYS}
    assert rows == expected


def test_defaults_are_the_common_recipes():
    """A default changed in base/mmpo_common.yaml changes the table."""
    common = yaml.safe_load(keys.COMMON_RECIPE.read_text(encoding="utf-8"))
    table = keys.keys_table()
    order = common["grpo"]["adv_estimator"]["truncation_order"]
    assert f"| `grpo.adv_estimator.truncation_order` | `{order}` |" in table
    assert f"| `loss_fn.name` | `{common['loss_fn']['name']}` |" in table


def test_a_key_without_a_description_stops_the_generation(monkeypatch):
    monkeypatch.delitem(keys.ESTIMATOR_KEYS, "k")
    with pytest.raises(ValueError, match=r"without a description.*'k'"):
        keys.keys_table()


def test_a_metric_without_a_description_stops_the_generation(monkeypatch):
    monkeypatch.delitem(keys.METRICS, "no_signal_fraction")
    with pytest.raises(ValueError, match="no_signal_fraction"):
        keys.metrics_table()


def test_a_description_of_a_metric_not_logged_stops_the_generation(monkeypatch):
    monkeypatch.setitem(keys.METRICS, "not_a_metric", "nothing")
    with pytest.raises(ValueError, match="not_a_metric"):
        keys.metrics_table()


def test_the_metrics_table_names_what_the_estimator_logs():
    table = keys.metrics_table()
    for name in ("mmpo/failure_moment_k", "mmpo/no_signal_fraction", "dmpo/penalty_term"):
        assert f"| `{name}` |" in table
