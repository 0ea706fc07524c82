"""Shared test helpers and fixtures.

This folder is on ``sys.path`` for every test (pytest puts a root ``conftest.py``'s folder
there), so the helpers beside it (``nemo_rl_support``, ``trainer_standins``) import by name.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import pytest
import torch

#: each test's CPU-seconds, where NEMO_MMPO_CPU_SECONDS asks for them (the NeMo-RL sessions)
pytest_plugins = ["cpu_seconds"]

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# A NeMo-RL snapshot unpacked by the test scripts is the checkout the launcher tests read
# NeMo-RL's base configs (and its config loader) from, unless NEMO_RL_PATH names another.
_SNAPSHOT = ROOT / ".nemo-rl" / "nemo-rl-v0.7.0"
if not os.environ.get("NEMO_RL_PATH") and (_SNAPSHOT / "nemo_rl").is_dir():
    os.environ["NEMO_RL_PATH"] = str(_SNAPSHOT)


def pytest_collection_modifyitems(config, items):
    """The long end-to-end runs outside this run's turn are deselected (``NEMO_MMPO_LONG_RUNS``;
    ``tests/long_runs.py``); a bad value or a long run in no turn stops the session, said."""
    import long_runs

    try:
        left_out = long_runs.deselected(items)
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        dropped = set(map(id, left_out))
        items[:] = [item for item in items if id(item) not in dropped]


def all_reward_patterns(group_size: int) -> torch.Tensor:
    """``[2**group_size, group_size]`` float64: every binary reward pattern of one group."""
    patterns = list(itertools.product((0.0, 1.0), repeat=group_size))
    return torch.tensor(patterns, dtype=torch.float64)


def pattern_probabilities(patterns: torch.Tensor, success_probability: float) -> torch.Tensor:
    """``[num_patterns]`` probability of each pattern under i.i.d. Bernoulli(success)."""
    successes = patterns.sum(dim=1)
    failures = patterns.shape[1] - successes
    return success_probability**successes * (1.0 - success_probability) ** failures


@pytest.fixture(scope="session")
def tiny_warm_starts(tmp_path_factory):
    """One warm-start cache for the session's tiny runs: the first run of a seed trains it
    (~225 steps, several CPU-minutes), the others read it. ``NEMO_MMPO_TEST_WARM_STARTS`` names
    a folder to use instead: ``scripts/test.sh`` trains the tiny recipe's into one while
    NeMo-RL's environments build and ``scripts/test_nemo_rl.sh`` gives it to both NeMo-RL
    snapshots' sessions (same interpreter and torch, and the warm start does not involve
    NeMo-RL); a run that needs it while it is being trained waits on its lock."""
    shared = os.environ.get("NEMO_MMPO_TEST_WARM_STARTS")
    if shared:
        Path(shared).mkdir(parents=True, exist_ok=True)
        return Path(shared)
    return tmp_path_factory.mktemp("tiny_warm_starts")


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster for one test module (2 CPUs, no dashboard), started as the CPU rig
    starts its own: again, said, where the raylet misses Ray's fixed start-up time on a loaded
    machine (``start_local_cluster``; seen in a fresh-clone CI's first test, 2026-11-28)."""
    import ray

    from nemo_mmpo.cpu.engines.ray_cluster import start_local_cluster

    # Ray actors (NeMo-RL's async trajectory collector) unpickle the stand-ins; NeMo-RL hands
    # them the driver's environment, so this folder goes on the driver's PYTHONPATH.
    previous = {key: os.environ.get(key) for key in ("PYTHONPATH", "RAY_ADDRESS")}
    os.environ.pop("RAY_ADDRESS", None)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS.parent), *sys.path])
    start_local_cluster(
        2,
        {
            "include_dashboard": False,
            "log_to_driver": False,
            "ignore_reinit_error": True,
            "runtime_env": {"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}},
        },
    )
    # NeMo-RL main's memory tracker finds Ray by address="auto": point it at this cluster even
    # if another Ray instance runs on the machine.
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    yield
    ray.shutdown()
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A 2-layer Llama with a character vocabulary of digits: its random answers are numbers,
    so some of them are right (the evaluation's tests'; here, not in a tests/eval/conftest.py,
    whose module name ``conftest`` shadowed this one's where tests import its helpers)."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, " ": 3}
    vocab.update({str(digit): 4 + digit for digit in range(10)})
    model = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    model.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=model, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    directory = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(autouse=True)
def registry_open_for_each_test():
    """``install()`` freezes the registry for the rest of its process (a run's); each test may
    register again (tests of the freeze freeze it themselves)."""
    from nemo_mmpo import registry

    registry.thaw()
