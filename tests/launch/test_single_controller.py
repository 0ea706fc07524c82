"""The entry point reaches NeMo-RL's single controller: a recipe with ``async_rl`` is checked
against the single controller's own declarations (its ``MasterConfig`` and
``validate_single_controller_config``, read from each snapshot's source), planned without
validation (the watcher evaluates its checkpoints), and handed to
``run_grpo_single_controller.py``; on v0.7.0, which has none, it is refused in one line.
Runs against both snapshots in one process, without ``nemo_rl``."""

from __future__ import annotations

import contextlib
import io
import os
import runpy
from pathlib import Path
from unittest import mock

import pytest
from single_controller_recipe import SINGLE_CONTROLLER_RECIPE
from snapshots import snapshot_archives, unpack

from nemo_mmpo.errors import handle
from nemo_mmpo.launch import train, trainers

ARCHIVES = {
    path.name.removeprefix("nemo-rl-").removesuffix(".tar.gz"): path for path in snapshot_archives()
}
RECIPE = "mmpo_single_controller_test.yaml"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory):
    if not ARCHIVES:
        pytest.skip("no NeMo-RL snapshots (NEMO_RL_SNAPSHOTS, default ../shared/nemo-rl)")
    return {ref: unpack(path, tmp_path_factory.mktemp(ref)) for ref, path in ARCHIVES.items()}


@pytest.fixture(scope="module")
def recipes(checkouts, tmp_path_factory):
    """For each snapshot, the single-controller recipe outside the shared ``examples/configs``,
    its base named by absolute path: the paper's recipe as that snapshot's checkout inherits it
    (:func:`snapshots.unpack`), so NeMo-RL main's single controller reads main's bases."""
    made = {}
    for ref, checkout in checkouts.items():
        path = tmp_path_factory.mktemp(f"recipes-{ref}") / RECIPE
        base = checkout.recipe("mmpo_math_qwen3_1.7b.yaml")
        path.write_text(SINGLE_CONTROLLER_RECIPE.format(base=base))
        made[ref] = path
    return made


def has_single_controller(checkout) -> bool:
    return (checkout.root / trainers.SINGLE_CONTROLLER_SCRIPT).is_file()


def dry_run(checkout, recipe, *overrides):
    out, err = io.StringIO(), io.StringIO()
    arguments = ["--config", str(recipe), "--dry-run", *overrides]
    with (
        mock.patch.dict(os.environ, NEMO_RL_PATH=str(checkout.root)),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        status = handle(train.main, arguments, "nemo-mmpo train")
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("ref", sorted(ARCHIVES))
def test_a_single_controller_recipe_is_checked_and_planned_for_it(checkouts, recipes, ref):
    checkout = checkouts[ref]
    status, out, err = dry_run(checkout, recipes[ref])
    if not has_single_controller(checkout):  # v0.7.0
        assert status == 2 and len(err.strip().splitlines()) == 1, err
        assert "run_grpo_single_controller.py" in err and "NEMO_RL_PATH" in err
        return
    assert status == 0, err
    assert "asynchronous GRPO in NeMo-RL's single controller" in out
    assert (
        "validation: none in the run (NeMo-RL's single controller "
        "(run_grpo_single_controller.py) refuses it, single_controller_utils/setup.py:533-537); "
        "the watcher (nemo-mmpo eval watch) evaluates its checkpoints" in out
    )
    assert "advantage: nemo-mmpo" in out


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        # the single controller's MasterConfig (async_rl is declared only there)
        (["async_rl.sampler.name=bogus"], ["async_rl.sampler", "single controller MasterConfig"]),
        # its validate_single_controller_config, read from the source
        (
            ["async_rl.min_groups_for_streaming_train=32"],
            ["must be >= async_rl.min_groups_for_streaming_train (32)"],
        ),
        (["policy.train_global_batch_size=64"], ["must equal policy.train_global_batch_size (64)"]),
        (["checkpointing.metric_name=val:accuracy"], ["'train:<name>'"]),
        # what its entry point and setup refuse, and what it never runs
        (["grpo.val_period=10"], ["grpo.val_period=10", "refuses validation", "watcher"]),
        (["data_plane.enabled=false"], ["data_plane.enabled=false"]),
        (["evaluation.in_loop=true"], ["evaluation.in_loop=true", "watcher"]),
    ],
)
def test_what_the_single_controller_refuses_is_refused_by_the_dry_run(
    checkouts, recipes, overrides, fragments
):
    checkout = next((c for c in checkouts.values() if has_single_controller(c)), None)
    if checkout is None:
        pytest.skip("no snapshot with the single controller (NeMo-RL main)")
    status, _, err = dry_run(checkout, recipes[checkout.ref], *overrides)
    assert status == 2, err
    for fragment in fragments:
        assert fragment in err


@pytest.mark.parametrize("ref", sorted(ARCHIVES))
def test_the_entry_point_hands_each_recipe_to_its_script(
    checkouts, recipes, ref, tmp_path, monkeypatch
):
    """``nemo-mmpo train`` after the checks: ``install()``, then NeMo-RL's script for the
    recipe (the call to it recorded here, not run)."""
    checkout = checkouts[ref]
    data = tmp_path / "inputs"  # not "data": its benchmarks would be looked for beside it
    data.mkdir()
    for name in ("train.jsonl", "validation.jsonl"):
        (data / name).write_text('{"problem": "1+1", "expected_answer": "2"}\n')
    (data / "prompt.txt").write_text("{}")
    overrides = [  # the user's data: the MATH task's prompt and benchmarks are not written
        f"data.train.data_path={data / 'train.jsonl'}",
        f"data.validation.data_path={data / 'validation.jsonl'}",
        f"data.default.prompt_file={data / 'prompt.txt'}",
        "evaluation.enabled=false",
        f"checkpointing.checkpoint_dir={tmp_path / 'run'}",
    ]
    ran = []
    monkeypatch.setattr(train, "install", lambda: ["hooked"])
    monkeypatch.setattr(runpy, "run_path", lambda path, run_name: ran.append(path))
    # where nemo_rl does not import (the 3.11 suite), train would move into NeMo-RL's uv
    # project first (tests/test_cli.py): here it goes on to the script, as it does there
    monkeypatch.setattr(train, "_move_into_nemo_rl", lambda argv, prog: None)
    monkeypatch.setenv("NEMO_RL_PATH", str(checkout.root))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", list(__import__("sys").argv))
    for path, script in (
        (checkout.recipe("mmpo_math_qwen3_1.7b.yaml"), trainers.GRPO_SCRIPT),
        (recipes[ref], trainers.SINGLE_CONTROLLER_SCRIPT),
    ):
        arguments = ["--config", str(path), *overrides]
        if script == trainers.SINGLE_CONTROLLER_SCRIPT and not has_single_controller(checkout):
            assert handle(train.main, arguments, "nemo-mmpo train") == 2
            continue
        ran.clear()
        assert train.main(arguments) == 0
        assert ran == [str(checkout.root / script)]


def test_a_recipe_without_async_rl_goes_to_run_grpo(tmp_path):
    (tmp_path / trainers.SINGLE_CONTROLLER_SCRIPT).parent.mkdir(parents=True)
    (tmp_path / trainers.SINGLE_CONTROLLER_SCRIPT).write_text("")
    grpo = {"grpo": {"async_grpo": {"enabled": True}}, "data_plane": {"enabled": True}}
    assert trainers.driver_script(grpo, tmp_path) == tmp_path / trainers.GRPO_SCRIPT
    assert trainers.driver_script({**grpo, "async_rl": {}}, tmp_path) == (
        tmp_path / trainers.SINGLE_CONTROLLER_SCRIPT
    )


TINY_RECIPE = ROOT / "examples" / "configs" / "mmpo_tiny_cpu_single_controller.yaml"


@pytest.mark.parametrize("ref", sorted(ARCHIVES))
def test_the_tiny_single_controller_recipe_is_planned_on_the_cpu_rig(checkouts, ref):
    """``mmpo_tiny_cpu_single_controller.yaml``: the CPU rig's single controller
    (tests/cpu/test_tiny_run_single_controller.py trains it), planned as such on main; on
    v0.7.0 refused in one line."""
    checkout = checkouts[ref]
    status, out, err = dry_run(checkout, TINY_RECIPE)
    if not has_single_controller(checkout):  # v0.7.0
        assert status == 2 and len(err.strip().splitlines()) == 1, err
        assert "run_grpo_single_controller.py" in err
        return
    assert status == 0, err
    assert "this machine's CPUs" in out and "SingleControllerActor" in out
    assert "AsyncLLM, a separate engine" in out and "collective weight synchronizer" in out
    # what the rig cannot run: the single controller trains Megatron and generates with vLLM
    status, _, err = dry_run(checkout, TINY_RECIPE, "cpu_backend.engine=transformers")
    assert status == 2, err
    assert "cpu_backend.policy=megatron and cpu_backend.engine=vllm" in err
