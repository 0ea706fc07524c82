"""The dry run reads a recipe exactly as NeMo-RL's ``run_grpo.py`` will, for every override form.

For each form the reference is NeMo-RL's own path (``load_config``, ``parse_hydra_overrides``,
``OmegaConf.to_container(resolve=True)`` with its resolvers, as ``run_grpo.py`` runs them) on
the recipe with its ``nemo_rl/`` bases reached by NeMo-RL's inheritance alone (a copy of our
recipes beside a link to the checkout's configs), and nemo-mmpo must find the same resolved
config or refuse where NeMo-RL refuses:

- through :func:`nemo_mmpo.recipes.load` as it runs here (NeMo-RL's loader, imported on
  the NeMo-RL suite, read from the checkout on the 3.11 suite where ``nemo_rl`` is not
  importable, as on a login node);
- through its no-checkout fallback (OmegaConf merges and Hydra's override parser driven by
  nemo-mmpo), on the same recipe;
- through the entry point, ``--dry-run --print-config``, from another working directory with a
  relative ``--config``, for a sample of the forms (on the 3.11 suite);
- and NeMo-RL's path on what the entry point hands its ``run_grpo.py`` (the composed recipe
  in the run's record, with the same overrides) finds the reference again.

Runs on the 3.11 suite and, marked ``nemo_rl``, on each NeMo-RL snapshot.
"""

from __future__ import annotations

import atexit
import copy
import functools
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import patience
import pytest
import yaml
from nemo_rl_support import nemo_rl_checkout, nemo_rl_inheritance

from nemo_mmpo import recipes as loader
from nemo_mmpo.errors import MMPOInputError

pytestmark = pytest.mark.nemo_rl
ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "configs" / "mmpo_math_qwen3_1.7b.yaml"
ENTRY_POINT = ROOT / "examples" / "run_mmpo_math.py"

FORMS = {
    "plain": ["grpo.adv_estimator.truncation_order=3"],
    "force_existing": ["++policy.train_micro_batch_size=4"],
    "force_new": ["++policy.brand_new_key=1"],
    "add_new": ["+grpo.adv_estimator.new_option=3"],
    "add_existing": ["+policy.max_grad_norm=0.5"],
    "add_nested_new": ["+new_section.inner.value=7"],
    "missing_key": ["grpo.adv_estimator.no_such_key=3"],
    "delete": ["~grpo.adv_estimator.k"],
    "delete_matching_value": ["~grpo.adv_estimator.k=3"],
    "delete_other_value": ["~grpo.adv_estimator.k=4"],
    "delete_missing": ["~policy.generation.top_k"],
    "delete_missing_section": ["~no_such_section.key"],
    "quoted_spaces": ["logger.log_dir='logs/with space'"],
    "double_quoted": ['logger.log_dir="logs/a b"'],
    "escaped_space": [r"logger.log_dir=logs/a\ b"],
    "scientific": [
        "grpo.adv_estimator.moment_transform=constant",
        "grpo.adv_estimator.transform_constant=5e-1",
    ],
    "scientific_small": ["loss_fn.ratio_clip_c=1e-3"],
    "null": ["grpo.adv_estimator.reward_threshold=null"],
    "integer_as_float": ["grpo.adv_estimator.truncation_order=3.0"],
    "boolean": ["grpo.normalize_rewards=True"],
    "list": ["+grpo.extra_list=[1,2,3]"],
    "list_of_strings": ["+grpo.extra_names=[a,'b c']"],
    "empty_list": ["+grpo.extra_list=[]"],
    "dict_merge": ["grpo.adv_estimator={name: mmpo, truncation_order: 2}"],
    "dict_new": ["+grpo.extra={a: 1, b: [x, y]}"],
    "interpolation": ["logger.log_dir=${checkpointing.checkpoint_dir}/logs"],
    "broken_interpolation": ["logger.log_dir=${checkpointing.no_such_key}/logs"],
    "resolver": ["+grpo.doubled=${mul:${grpo.num_prompts_per_step},2}"],
    "two_overrides_same_key": ["grpo.max_num_steps=5", "grpo.max_num_steps=7"],
    "empty_value": ["logger.log_dir="],
    "no_equals": ["grpo.max_num_steps"],
    "no_key": ["=3"],
    "unbalanced_bracket": ["+grpo.extra_list=[1,2"],
    "unbalanced_quote": ["logger.log_dir='abc"],
    "string_number": ["grpo.adv_estimator.name='4'"],
    "negative": ["grpo.advantage_clip_low=-5"],
    "infinity": ["grpo.advantage_clip_high=inf"],
}


@functools.cache
def inheriting_copy(checkout: Path) -> Path:
    """Our recipes beside a ``nemo_rl`` link to ``checkout``'s configs, in a folder of their own:
    NeMo-RL's inheritance alone, none of our resolution of ``defaults:``."""
    folder = Path(tempfile.mkdtemp(prefix="parity-"))
    atexit.register(shutil.rmtree, folder, True)
    return nemo_rl_inheritance(checkout, folder) / RECIPE.name


def reference(overrides: list[str], recipe: Path | None = None) -> dict | str:
    """NeMo-RL's path, as its ``run_grpo.py`` runs it: the resolved config, or "refused"
    (``recipe``: default, the recipe as NeMo-RL's own inheritance reads it). Read once per
    form and recipe (each form's tests compare against the same reading: ~0.5 CPU-s a
    reading, ~100 readings a session); each caller gets its own copy."""
    return copy.deepcopy(_reference(tuple(overrides), recipe, nemo_rl_checkout()))


@functools.cache
def _reference(overrides: tuple[str, ...], recipe: Path | None, checkout: Path) -> dict | str:
    from omegaconf import OmegaConf

    module, _ = loader.nemo_rl_config_module(checkout)
    assert module is not None
    module.register_omegaconf_resolvers()
    try:
        config = module.load_config(str(recipe or inheriting_copy(checkout)))
        if overrides:
            config = module.parse_hydra_overrides(config, list(overrides))
        return OmegaConf.to_container(config, resolve=True)
    except Exception:
        return "refused"


def ours(overrides: list[str]) -> dict | str:
    try:
        return loader.load(RECIPE, overrides).config
    except MMPOInputError:
        return "refused"


@pytest.mark.parametrize("form", FORMS, ids=list(FORMS))
def test_load_finds_what_nemo_rl_finds(form):
    nemo_rl_checkout()
    expected = reference(FORMS[form])
    assert ours(FORMS[form]) == expected


@pytest.fixture(scope="module")
def run_record(tmp_path_factory) -> Path:
    """The run's record the entry point writes for the recipe (what NeMo-RL's ``run_grpo.py``
    is handed), written once for the module's forms."""
    nemo_rl_checkout()
    return loader.write_run_record(loader.load(RECIPE), tmp_path_factory.mktemp("record"))


@pytest.mark.parametrize("form", FORMS, ids=list(FORMS))
def test_nemo_rls_trainer_reads_the_run_record_as_the_dry_run_read_the_recipe(form, run_record):
    """What the entry point hands NeMo-RL's ``run_grpo.py`` (the composed recipe in the run's
    record, and the overrides) is, through NeMo-RL's own path, NeMo-RL's reading of the recipe."""
    assert reference(FORMS[form], run_record) == reference(FORMS[form])


@pytest.mark.parametrize("form", FORMS, ids=list(FORMS))
def test_the_fallback_without_a_checkout_finds_the_same(form, monkeypatch):
    """OmegaConf and Hydra driven by nemo-mmpo (no NeMo-RL code), on the same recipe, its
    ``nemo_rl/`` bases read from the checkout."""
    nemo_rl_checkout()
    expected = reference(FORMS[form])
    monkeypatch.setattr(loader, "nemo_rl_config_module", lambda root: (None, ""))
    assert ours(FORMS[form]) == expected


def test_a_few_forms_agree_through_the_entry_point_from_another_directory(tmp_path):
    """``--dry-run --print-config`` with a ``--config`` relative to the working directory:
    the YAML it prints is NeMo-RL's resolved config; a refused form exits 2.

    On the 3.11 suite only, where the entry point reads NeMo-RL from the checkout as on a login
    node (CI time: where NeMo-RL imports, each launch spends ~12 s importing it; the forms are
    compared with NeMo-RL imported on every snapshot above, and the NeMo-RL suite launches
    the entry point in test_ray_nodes.py and test_tiny_run.py's log-file test)."""
    if importlib.util.find_spec("nemo_rl") is not None:
        pytest.skip("the 3.11 suite runs the entry point (NeMo-RL read from the checkout)")
    nemo_rl_checkout()
    relative = os.path.relpath(RECIPE, tmp_path)
    for form in ("plain", "scientific", "dict_merge", "quoted_spaces", "delete"):
        result = patience.run(
            [
                sys.executable,
                str(ENTRY_POINT),
                "--config",
                relative,
                "--print-config",
                *FORMS[form],
            ],
            capture_output=True,
            text=True,
            timeout=patience.COMMAND_S,
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        printed = result.stdout.split("--- resolved config (what NeMo-RL trains with) ---\n")[1]
        assert yaml.safe_load(printed) == reference(FORMS[form]), form
    result = patience.run(
        [
            sys.executable,
            str(ENTRY_POINT),
            "--config",
            relative,
            "--dry-run",
            *FORMS["add_existing"],
        ],
        capture_output=True,
        text=True,
        timeout=patience.COMMAND_S,
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "were refused" in result.stderr
    assert reference(FORMS["add_existing"]) == "refused"
