"""No override ends in a traceback: generated override sets, each dry run a plan or one error.

``hypothesis`` draws a shipped recipe and a few overrides: keys from every shipped recipe's
resolved config (sections and leaves, and new keys below them), values of every YAML type and
hostile strings, in every form of Hydra's grammar (``key=v``, ``+key=v``, ``++key=v``, ``~key``,
``~key=v``). Each set runs ``nemo-mmpo train --config <recipe> --dry-run`` in this process
(the command's own ``main`` through its own error handler, :func:`nemo_mmpo.errors.handle`)
against each NeMo-RL snapshot, as a login node reads it: a checkout whose ``nemo_rl`` does not
import here. It must end in a plan (status 0) or in one ``error:`` line (status 2); any
exception fails the test with the override set that raised it. One thing is shortened: each
recipe is composed (its ``defaults:`` chain read and merged: :func:`nemo_mmpo.recipes.compose`,
0.5 s) and read back by NeMo-RL's ``load_config`` once, then copied for each set; the overrides,
their resolution, every check and the plan run as the command runs them.

``NEMO_MMPO_OVERRIDE_EXAMPLES`` sets the examples per snapshot (default 150: about 30 s of CPU for
both snapshots; ``=2000`` for the issue's few thousand, ~15 minutes on a busy 2-core machine).
Under ``CI=true`` the sets are the same every run (``derandomize``); elsewhere they vary.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import math
import os
from unittest import mock

import pytest
from snapshots import CONFIGS, snapshot_archives, unpack

from nemo_mmpo import recipes
from nemo_mmpo.errors import handle
from nemo_mmpo.launch import train

# the NeMo-RL suite's environment (3.13) has no hypothesis: this module runs on the 3.11 suite
hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")
HealthCheck, example, given = hypothesis.HealthCheck, hypothesis.example, hypothesis.given
settings = hypothesis.settings
RECIPES = sorted(path.name for path in CONFIGS.glob("*.yaml"))
EXAMPLES = int(os.environ.get("NEMO_MMPO_OVERRIDE_EXAMPLES", "150"))

#: hostile scalars: Hydra and OmegaConf syntax, YAML look-alikes, interpolations, odd text
HOSTILE = [
    "",
    "''",
    '""',
    "mmpo",
    "MMPO",
    "null",
    "None",
    "~",
    "true",
    "yes",
    "off",
    "nan",
    "inf",
    "-inf",
    "1e400",
    "-0",
    "0x10",
    "1_000",
    "2.5",
    "1/2",
    "[]",
    "{}",
    "[1,2]",
    "[mmpo,1.5,null]",
    "{a:1}",
    "{enabled:true}",
    "[1,",
    "{a:",
    "${policy.model_name}",
    "${oops}",
    "${mul:2,3}",
    "${div:1,0}",
    "${oc.env:HOME}",
    "'${oops}'",
    "a=b",
    "+x",
    "key==",
    "\\\\",
    "'it''s'",
    "∞",
    "é",
    "' '",
    "int",
    "choice(1,2)",
    "range(3)",
    "interval(0,1)",
]


def _flat_keys(node, prefix=""):
    keys = []
    if isinstance(node, dict):
        for key, item in node.items():
            path = f"{prefix}{key}"
            keys.append(path)
            keys += _flat_keys(item, f"{path}.")
    return keys


class RecipeOnce:
    """NeMo-RL's config module with ``load_config`` read once per file (a copy each call), and
    :func:`nemo_mmpo.recipes.compose` run once per recipe (:meth:`compose`)."""

    def __init__(self, module):
        self.module = module
        self.loaded = functools.cache(module.load_config)
        self.composed = {}
        self.compose_each_time = recipes.compose

    def compose(self, path, nemo_rl_root, merge, _chain=()):
        """A recipe's composed config, made once (``load`` only writes it out as YAML); the
        bases it inherits (``_chain`` not empty) are composed as the command composes them."""
        if _chain:
            return self.compose_each_time(path, nemo_rl_root, merge, _chain)
        key = (str(path), str(nemo_rl_root))
        if key not in self.composed:
            self.composed[key] = self.compose_each_time(path, nemo_rl_root, merge)
        return self.composed[key]

    def load_config(self, path):
        return copy.deepcopy(self.loaded(path))

    def __getattr__(self, name):
        return getattr(self.module, name)


@pytest.fixture(scope="module", params=[path.name for path in snapshot_archives()] or [None])
def snapshot(request, tmp_path_factory):
    """One NeMo-RL snapshot (its checkout and our recipes inheriting it) and the keys of every
    shipped recipe's resolved config."""
    if request.param is None:
        pytest.skip("no NeMo-RL snapshots (NEMO_RL_SNAPSHOTS, default ../shared/nemo-rl)")
    archive = next(path for path in snapshot_archives() if path.name == request.param)
    checkout = unpack(archive, tmp_path_factory.mktemp("snapshot"))
    module, label = recipes.nemo_rl_config_module(checkout.root)
    assert module is not None and "read from" in label  # NeMo-RL's own loader, not imported
    once = RecipeOnce(module)
    with reading(checkout, once, label):
        configs = [recipes.load(checkout.recipe(name)).config for name in RECIPES]
    keys = sorted({key for config in configs for key in _flat_keys(config)})
    return checkout, keys, once, label


@contextlib.contextmanager
def reading(checkout, once, label):
    """The dry run reads ``checkout``, each recipe file once."""
    with (
        mock.patch.dict(os.environ, NEMO_RL_PATH=str(checkout.root)),
        mock.patch.object(recipes, "nemo_rl_config_module", lambda root: (once, label)),
        mock.patch.object(recipes, "compose", once.compose),
    ):
        yield


def _number(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)


def values() -> st.SearchStrategy[str]:
    """An override's value, as typed on the command line."""
    scalars = st.one_of(
        st.sampled_from(HOSTILE),
        st.integers(-(10**12), 10**12).map(str),
        st.sampled_from([-1, 0, 1, 2, 3, 7, 8, 16]).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(_number),
        st.booleans().map(lambda flag: str(flag).lower()),
        st.text(max_size=8).map(lambda text: "'" + text.replace("'", "") + "'"),
        st.text(alphabet="ab1 .,:=+~[]{}'\"$\\-_", max_size=8),
    )
    return st.one_of(
        scalars,
        st.lists(scalars, max_size=3).map(lambda items: "[" + ",".join(items) + "]"),
        st.dictionaries(st.sampled_from(["enabled", "a", "name", "0"]), scalars, max_size=2).map(
            lambda items: "{" + ",".join(f"{k}:{v}" for k, v in items.items()) + "}"
        ),
    )


@st.composite
def override(draw, keys: list[str]) -> str:
    key = draw(st.sampled_from(keys))
    if draw(st.booleans()):
        key += "." + draw(st.sampled_from(["extra", "enabled", "name", "0", "x.y"]))
    form = draw(st.sampled_from(["", "", "", "+", "++", "~", "~="]))
    if form == "~":
        return f"~{key}"
    if form == "~=":
        return f"~{key}={draw(values())}"
    return f"{form}{key}={draw(values())}"


def dry_run(arguments: list[str]) -> tuple[int, str, str]:
    """``nemo-mmpo train ARGUMENTS`` in this process: (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = handle(train.main, arguments, "nemo-mmpo train")
    return status, out.getvalue(), err.getvalue()


def assert_plan_or_one_error(status: int, out: str, err: str) -> None:
    assert status in (0, 2), (status, out, err)
    if status == 0:
        assert "rollouts/step" in out and "Traceback" not in err and "error" not in err, err
    else:
        lines = err.splitlines()
        assert lines and lines[0].startswith("error: "), err
        assert all(line.startswith("  ") for line in lines[1:]), err  # a list of findings
        assert "Traceback" not in err


def test_every_override_set_ends_in_a_plan_or_one_error(snapshot):
    checkout, keys, once, label = snapshot

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=os.environ.get("CI") == "true",  # CI: the same sets every run
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    # found by a local run (2026-11-26): a section NeMo-RL does not declare, set to a string
    @example("mmpo_tiny_cpu_async_vllm.yaml", ["policy.generation.vllm_cfg=mmpo"], False)
    @given(
        recipe=st.sampled_from(RECIPES),
        overrides=st.lists(override(keys), min_size=1, max_size=4),
        print_config=st.booleans(),
    )
    def one_set(recipe: str, overrides: list[str], print_config: bool) -> None:
        arguments = ["--config", str(checkout.recipe(recipe)), "--dry-run", *overrides]
        arguments += ["--print-config"] if print_config else []
        assert_plan_or_one_error(*dry_run(arguments))

    with reading(checkout, once, label):
        one_set()


ISSUE_CASES = [
    ("cluster.num_nodes=mmpo", ["cluster.num_nodes='mmpo'", "a valid integer"]),
    (
        "policy.megatron_cfg.pipeline_model_parallel_size=0",
        ["policy.megatron_cfg.pipeline_model_parallel_size=0", "an integer >= 1"],
    ),
    (
        "+policy.megatron_cfg.tensor_model_parallel_size.extra=''",
        ["policy.megatron_cfg.tensor_model_parallel_size={'extra': ''}", "a valid integer"],
    ),
]


@pytest.mark.parametrize(("override_text", "fragments"), ISSUE_CASES)
def test_the_issues_three_tracebacks_are_one_error_line(snapshot, override_text, fragments):
    checkout, _, once, label = snapshot
    recipe = checkout.recipe("mmpo_math_qwen3_1.7b.yaml")
    with reading(checkout, once, label):
        status, out, err = dry_run(["--config", str(recipe), "--dry-run", override_text])
    assert status == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    for fragment in fragments:
        assert fragment in err
