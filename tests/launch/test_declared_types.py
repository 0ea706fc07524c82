"""NeMo-RL's own declared types, read from a checkout's source, check every key of a recipe.

On the 3.11 suite ``nemo_rl`` does not import (a login node); the ``MasterConfig`` is read from
each snapshot's source. On the NeMo-RL suite (3.13, each snapshot) the class read from source
refuses exactly what the imported ``MasterConfig`` refuses, error by error.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from unittest import mock

import pytest
from snapshots import snapshot_archives, unpack

from nemo_mmpo.errors import handle
from nemo_mmpo.launch import declared_types, train
from nemo_mmpo.launch.declarations import declared_class, unknown
from nemo_mmpo.nemo_rl import newer_nemo_rl
from nemo_mmpo.nemo_rl.names import NEMO_RL_ESTIMATORS
from nemo_mmpo.recipes import load

ARCHIVES = {
    path.name.removeprefix("nemo-rl-").removesuffix(".tar.gz"): path for path in snapshot_archives()
}
MAIN = next((ref for ref in ARCHIVES if ref.startswith("main")), None)
RECIPE = "mmpo_math_qwen3_1.7b.yaml"


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory):
    if not ARCHIVES:
        pytest.skip("no NeMo-RL snapshots (NEMO_RL_SNAPSHOTS, default ../shared/nemo-rl)")
    return {ref: unpack(path, tmp_path_factory.mktemp(ref)) for ref, path in ARCHIVES.items()}


def dry_run(checkout, *overrides):
    out, err = io.StringIO(), io.StringIO()
    arguments = ["--config", str(checkout.recipe(RECIPE)), "--dry-run", *overrides]
    with (
        mock.patch.dict(os.environ, NEMO_RL_PATH=str(checkout.root)),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        status = handle(train.main, arguments, "nemo-mmpo train")
    return status, out.getvalue(), err.getvalue()


def loaded(checkout, *overrides):
    with mock.patch.dict(os.environ, NEMO_RL_PATH=str(checkout.root)):
        return load(checkout.recipe(RECIPE), overrides).config


@pytest.mark.parametrize("ref", sorted(ARCHIVES))
def test_the_master_config_is_nemo_rls_own_class_read_from_its_source(checkouts, ref):
    master_config = declared_class(checkouts[ref].root)
    assert master_config.__name__ == "MasterConfig"
    assert {"policy", "loss_fn", "grpo", "cluster", "checkpointing", "logger"} <= set(
        master_config.model_fields
    )
    assert "nemo_rl.algorithms.grpo" in master_config.__module__  # NeMo-RL's module, not ours


@pytest.mark.parametrize("ref", sorted(ARCHIVES))
@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("logger.log_dir=[1]", "logger.log_dir=[1]: NeMo-RL's MasterConfig"),
        ("grpo.val_period=1.5", "grpo.val_period=1.5: NeMo-RL's MasterConfig"),
        ("~cluster", "cluster is missing: NeMo-RL's MasterConfig"),
        (
            "policy.megatron_cfg.enabled=maybe",
            "policy.megatron_cfg.enabled='maybe': NeMo-RL's MasterConfig",
        ),
    ],
)
def test_a_value_nemo_rl_refuses_is_one_line_naming_key_value_and_what_it_accepts(
    checkouts, ref, override, fragment
):
    status, out, err = dry_run(checkouts[ref], override)
    assert (status, out) == (2, "")
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {fragment}"), err
    assert " accepts " in err or " requires it" in err


def test_of_a_union_the_branch_the_value_came_closest_to_is_named(checkouts):
    """``megatron_cfg`` is ``MegatronConfig | MegatronConfigDisabled``: a bad size in an enabled
    section names the size, not the other branch's ``enabled: false``."""
    checkout = next(iter(checkouts.values()))
    status, _, err = dry_run(checkout, "policy.megatron_cfg.context_parallel_size=two")
    assert status == 2
    assert "policy.megatron_cfg.context_parallel_size='two'" in err
    assert "enabled" not in err


@pytest.mark.parametrize("ref", sorted(ARCHIVES))
def test_a_value_nemo_rl_converts_is_warned_and_planned_as_nemo_rl_reads_it(checkouts, ref):
    status, out, _ = dry_run(checkouts[ref], 'cluster.num_nodes="3"')
    assert status == 0
    assert "cluster: 3 node(s) x 2 GPU(s) = 6 GPU(s)" in out
    assert "WARNING: cluster.num_nodes='3': NeMo-RL's MasterConfig" in out
    assert "converting it to 3" in out


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("policy.megatron_cfg.tensor_model_parallel_size=3", "not a multiple of tensor"),
        ("cluster.gpus_per_node=0", "cluster.gpus_per_node=0: give an integer >= 1"),
        ("policy.train_micro_batch_size=-1", "policy.train_micro_batch_size=-1: give an"),
        ("policy.megatron_cfg.context_parallel_size=0", "context_parallel_size=0: give an"),
    ],
)
def test_the_parallel_layout_rules(checkouts, override, fragment):
    checkout = next(iter(checkouts.values()))
    status, _, err = dry_run(checkout, override)
    assert status == 2 and fragment in err and len(err.splitlines()) == 1, err


def test_a_dtensor_recipe_does_not_read_megatrons_sizes(checkouts):
    checkout = next(iter(checkouts.values()))
    status, out, err = dry_run(
        checkout,
        "policy.megatron_cfg.enabled=false",
        "policy.dtensor_cfg.enabled=true",
        "policy.megatron_cfg.pipeline_model_parallel_size=0",
    )
    assert status == 0, err
    assert "DTensor, tensor 1 x pipeline 1 x context 1 -> data parallel 2" in out


def test_without_a_checkout_the_types_are_not_checked_and_it_says_so(checkouts):
    config = loaded(next(iter(checkouts.values())))
    with mock.patch.object(declared_types, "find_nemo_rl_root", return_value=None):
        checked = declared_types.check(config)
    assert checked.error is None and checked.config is config
    assert len(checked.warnings) == 1 and "set NEMO_RL_PATH" in checked.warnings[0]


def test_names_from_outside_nemo_rl_accept_anything():
    from pydantic import TypeAdapter

    dtype = unknown("torch").dtype
    assert TypeAdapter(dtype).validate_python(object) is object
    assert TypeAdapter(dtype | None).validate_python("bfloat16") == "bfloat16"
    assert unknown("os").PathLike[str].__name__ == "os.PathLike"


def literal_estimator_name(source: str) -> str:
    """NeMo-RL #3773's change, as its description says: the estimator config's ``name``
    narrowed to a ``Literal`` of NeMo-RL's own names."""
    changed, count = re.subn(
        r"^(\s+)name: str = \"grpo\".*$",
        lambda match: f'{match[1]}name: Literal{list(NEMO_RL_ESTIMATORS)!r} = "grpo"',
        source,
        flags=re.MULTILINE,
    )
    assert count == 1
    return "from typing import Literal\n" + changed


@pytest.fixture
def literal_checkout(checkouts, tmp_path):
    """A copy of the main snapshot whose estimator name is a ``Literal`` (#3773, simulated)."""
    if MAIN is None:
        pytest.skip("no main snapshot")
    import shutil

    checkout = checkouts[MAIN]
    root = tmp_path / "nemo-rl-3773"
    shutil.copytree(checkout.root, root, symlinks=True)
    source = root / "nemo_rl" / "algorithms" / "advantage_estimator.py"
    source.write_text(literal_estimator_name(source.read_text()))
    return type(checkout)(f"{MAIN}+3773", root, checkout.configs)


def test_with_a_literal_estimator_name_our_names_stay_valid_and_others_refused(
    literal_checkout, monkeypatch
):
    status, out, err = dry_run(literal_checkout)
    assert status == 0, err
    assert "advantage: nemo-mmpo" in out
    status, _, err = dry_run(literal_checkout, "grpo.adv_estimator.name=mmpoo")
    assert status == 2 and "grpo.adv_estimator.name='mmpoo'" in err
    assert "'grpo'" in err and "'mmpo'" in err  # what is accepted: NeMo-RL's names and ours


def test_the_literal_copy_refuses_mmpo_without_our_names(literal_checkout, monkeypatch):
    """The simulation bites: without :func:`accept_our_estimator_names` the changed NeMo-RL
    refuses ``name: mmpo`` (as a run would, before our factory hook)."""
    monkeypatch.setattr(declared_types, "accept_our_estimator_names", lambda model: [])
    declared_class.cache_clear()
    try:
        status, _, err = dry_run(literal_checkout)
    finally:
        declared_class.cache_clear()
    assert status == 2 and "grpo.adv_estimator.name='mmpo'" in err


def test_a_plain_string_name_is_left_alone(checkouts):
    for checkout in checkouts.values():
        assert newer_nemo_rl.accept_our_estimator_names(declared_class(checkout.root)) == []


@pytest.mark.nemo_rl
def test_the_class_read_from_source_refuses_what_the_imported_one_refuses():
    """On the NeMo-RL suite: the imported ``MasterConfig`` and the one read from the same
    checkout's source give the same errors (location, kind) on every recipe and bad values."""
    from nemo_rl_support import import_nemo_rl
    from pydantic import ValidationError

    from nemo_mmpo.checkout import CONFIGS_DIR, find_nemo_rl_root

    imported = import_nemo_rl("nemo_rl.algorithms.grpo").MasterConfig
    read = declared_class(find_nemo_rl_root())
    assert read is not imported

    def errors(master_config, config):
        try:
            master_config(**config)
        except ValidationError as error:
            return sorted((item["loc"], item["type"]) for item in error.errors())
        return []

    bad_values = [
        ["cluster.num_nodes=mmpo"],
        ["+policy.megatron_cfg.tensor_model_parallel_size.extra=''"],
        ["policy.dtensor_cfg.enabled=mmpo"],
        ["grpo.val_period=1.5"],
        ["~cluster"],
        ["logger.log_dir=[1]"],
        ["loss_fn.ratio_clip_min=low"],
        ["checkpointing.enabled=sometimes"],
        ["policy.generation.temperature=hot"],
        ["grpo.adv_estimator.name=7"],
    ]
    recipes = sorted(CONFIGS_DIR.glob("*.yaml"))
    varied = ("mmpo_math_qwen3_1.7b.yaml", "grpo_math_qwen3_1.7b.yaml", "mmpo_tiny_cpu.yaml")
    cases = [(recipe, []) for recipe in recipes]  # every recipe as shipped
    cases += [(recipe, bad) for recipe in recipes if recipe.name in varied for bad in bad_values]
    compared = refused = 0
    for recipe, override in cases:
        config = load(recipe, override).config
        sections = {k: v for k, v in config.items() if k not in ("cpu_backend", "evaluation")}
        found = errors(read, sections)
        assert found == errors(imported, sections), (recipe.name, override)
        compared += 1
        refused += bool(found)
    assert compared == len(cases) and refused >= len(bad_values)
