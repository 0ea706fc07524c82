"""The measured warm start: it stops in its band, rolls back an overshoot, fails loudly at its
cap, and its cache gives the same weights without training again."""

from __future__ import annotations

import dataclasses
import json

import patience
import pytest
import torch

from nemo_mmpo.cpu.rig.model import ModelShape, char_tokenizer, tiny_llama
from nemo_mmpo.cpu.rig.task import AdditionTask, FormattedProblem
from nemo_mmpo.cpu.rig.warm_start import (
    INFO_FILE,
    Sampler,
    WarmStartError,
    WarmStartSettings,
    WarmStartSpec,
    load_or_make,
    supervised_batch,
    warm_start,
)
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.settings import parse

SMALL = ModelShape(hidden_size=32, num_layers=1, num_heads=2)
SAMPLER = Sampler(temperature=1.0, top_p=1.0, max_new_tokens=12)


def problems(count=64):
    return AdditionTask(train_size=count).split()[0]


def weights(model):
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


class Script:
    """A measurement that returns scripted success rates and records the step of each call."""

    def __init__(self, values):
        self.values = list(values)
        self.seen = []

    def __call__(self, model, tokenizer, measured, samples, sampler):
        self.seen.append(weights(model))
        return self.values.pop(0)


def test_a_real_warm_start_stops_inside_its_band():
    """Sampling graded by Math-Verify, a loose band and a small model: it ends in the band
    (by construction: the loop returns nowhere else) and says where it stopped."""
    tokenizer = char_tokenizer()
    model = tiny_llama(tokenizer, ModelShape(hidden_size=64, num_layers=2), seed=0)
    settings = WarmStartSettings(
        target_low=0.02,
        target_high=0.9,
        learning_rate=3e-3,
        batch_size=64,
        check_every=50,
        check_prompts=48,
        check_samples=2,
        max_steps=1500,
    )
    result = warm_start(model, tokenizer, problems(256), settings, SAMPLER, seed=0)
    assert settings.target_low <= result.success <= settings.target_high
    assert result.measurements[-1] == {
        "step": result.steps,
        "success": result.success,
        "loss": result.measurements[-1]["loss"],
    }
    assert all(m["success"] < settings.target_low for m in result.measurements[:-1])
    assert next(model.parameters()).dtype == torch.float32


def test_an_overshoot_rolls_back_and_measures_again_more_often():
    tokenizer = char_tokenizer()
    model = tiny_llama(tokenizer, SMALL, seed=0)
    settings = WarmStartSettings(check_every=8, batch_size=8, max_steps=100)
    script = Script([0.1, 0.9, 0.2, 0.4])  # below, above (roll back), below, inside
    result = warm_start(model, tokenizer, problems(), settings, SAMPLER, seed=0, measure=script)
    assert [m["step"] for m in result.measurements] == [8, 16, 10, 12]
    assert result.rollbacks == 1 and result.steps == 12 and result.success == 0.4
    # after the rollback, training restarted from the weights measured at step 8
    replay = tiny_llama(tokenizer, SMALL, seed=0)
    again = Script([0.1, 0.3])  # the same data order, measured at 8 and 10 without a detour
    warm_start(
        replay,
        tokenizer,
        problems(),
        settings.model_copy(update={"max_steps": 10}),
        SAMPLER,
        seed=0,
        measure=again,
    )
    for name, value in script.seen[2].items():  # the step-10 measurement of both runs
        torch.testing.assert_close(value, again.seen[1][name], rtol=0, atol=0)


def test_the_cap_and_a_one_step_jump_are_errors_naming_the_fix():
    tokenizer = char_tokenizer()
    settings = WarmStartSettings(check_every=4, batch_size=4, max_steps=8)
    with pytest.raises(WarmStartError, match=r"max_steps=8 .*raise max_steps"):
        warm_start(
            tiny_llama(tokenizer, SMALL, 0),
            tokenizer,
            problems(),
            settings,
            SAMPLER,
            0,
            measure=Script([0.0, 0.1]),
        )
    with pytest.raises(WarmStartError, match=r"jumped over the band .* in one step"):
        warm_start(
            tiny_llama(tokenizer, SMALL, 0),
            tokenizer,
            problems(),
            settings.model_copy(update={"check_every": 1, "max_steps": 50}),
            SAMPLER,
            0,
            measure=Script([0.9]),
        )


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"target_low": 0.6}, r"the target band \[0.6, 0.55\] is empty"),
        ({"check_every": 0}, "warm_start.check_every=0: give a value >= 1"),
        ({"learning_rate": 0.0}, "warm_start.learning_rate=0.0: give a value > 0"),
        ({"dtype": "bfloat16"}, "warm_start.dtype='bfloat16': input should be 'float32' or"),
        ({"max_steps": 10.0}, "warm_start.max_steps=10.0: give an integer"),
    ],
)
def test_bad_settings_are_named(changes, fragment):
    with pytest.raises(MMPOInputError, match=fragment):
        parse(WarmStartSettings, changes, "cpu_backend.warm_start")


def test_float64_arithmetic_leaves_a_float32_policy():
    tokenizer = char_tokenizer()
    model = tiny_llama(tokenizer, SMALL, seed=0)
    settings = WarmStartSettings(check_every=2, batch_size=4, max_steps=10, dtype="float64")
    seen = []

    def measure(model, *args):
        seen.append(next(model.parameters()).dtype)
        return 0.4

    warm_start(model, tokenizer, problems(), settings, SAMPLER, seed=0, measure=measure)
    assert seen == [torch.float64] and next(model.parameters()).dtype == torch.float32


def cached_spec() -> WarmStartSpec:
    """A small warm start for the cache tests (its measurement is scripted)."""
    return WarmStartSpec(
        task=AdditionTask(train_size=64),
        shape=SMALL,
        settings=WarmStartSettings(check_every=3, batch_size=4, max_steps=30),
        sampler=SAMPLER,
        seed=1,
    )


def test_the_cache_returns_the_same_weights_without_training(tmp_path, monkeypatch):
    tokenizer = char_tokenizer()
    spec = cached_spec()
    import nemo_mmpo.cpu.rig.warm_start as module

    original = module.warm_start
    monkeypatch.setattr(
        module,
        "warm_start",
        lambda *args, **kwargs: original(*args, **kwargs, measure=Script([0.3])),
    )
    first, result, directory = load_or_make(spec, tokenizer, tmp_path, log=lambda message: None)
    assert directory == tmp_path / spec.key() and (directory / "tokenizer.json").is_file()
    info = json.loads((directory / INFO_FILE).read_text())
    assert info["result"]["steps"] == 3 and info["result"]["made_by"]["torch"] == torch.__version__
    monkeypatch.setattr(module, "warm_start", None)  # a second call must not train
    second, again, _ = load_or_make(spec, tokenizer, tmp_path, log=lambda message: None)
    assert again == result
    for name, value in first.state_dict().items():
        assert torch.equal(value, second.state_dict()[name])
    other = dataclasses.replace(spec, seed=2)
    assert other.key() != spec.key()  # everything that determines it is in the key
    assert dataclasses.replace(spec, sampler=Sampler(temperature=0.7)).key() != spec.key()


def test_two_processes_asking_for_the_same_warm_start_train_it_once(tmp_path, monkeypatch):
    """Two callers at once (two seeds' runs, two test sessions sharing a cache): the second
    waits on the first's lock and reads what it saved; without the lock both would train."""
    import threading

    import nemo_mmpo.cpu.rig.warm_start as module

    tokenizer = char_tokenizer()
    spec = cached_spec()
    original = module.warm_start
    trained = []
    second_waits = threading.Event()

    def slow_warm_start(*args, **kwargs):
        trained.append(threading.current_thread().name)
        assert second_waits.wait(
            timeout=patience.COMMAND_S
        )  # the other caller is blocked on the lock by now
        return original(*args, **kwargs, measure=Script([0.3]))

    monkeypatch.setattr(module, "warm_start", slow_warm_start)
    results = {}
    messages = []

    def log(message):
        messages.append(message)
        if "waiting" in message:
            second_waits.set()

    def call(name):
        results[name] = load_or_make(spec, tokenizer, tmp_path, log=log)

    threads = [threading.Thread(target=call, args=(name,), name=name) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=patience.COMMAND_S)
    assert len(trained) == 1 and set(results) == {"a", "b"}
    assert sum("reusing" in message for message in messages) == 1
    first, second = (results[name][0] for name in ("a", "b"))
    for name, value in first.state_dict().items():
        assert torch.equal(value, second.state_dict()[name])


def test_formatted_prompts_are_what_it_learns_and_are_in_its_key():
    """A recipe's formatting (``spec.prompts``: the sums as NeMo-RL formats them, here with the
    newline a prompt file ends with): the warm start's problems carry those prompts, it learns
    their tokens (the newline's too) before the response, and each prompt is in the cache key;
    without prompts the key is the rig's own (``parts`` without ``prompts``)."""
    tokenizer = char_tokenizer()
    spec = cached_spec()
    train, _ = spec.task.split()
    prompts = tuple(f"{problem.prompt}\n" for problem in train)
    formatted = dataclasses.replace(spec, prompts=prompts)
    learned = formatted.training_problems()
    assert learned == [FormattedProblem(p, text) for p, text in zip(train, prompts, strict=True)]
    assert spec.training_problems() == train and "prompts" not in spec.parts()
    batch = supervised_batch(tokenizer, learned[:1])
    newline = tokenizer.encode("\n", add_special_tokens=False)
    assert newline == [tokenizer.unk_token_id]  # not printable: the one unknown token
    row = tokenizer.encode(prompts[0] + train[0].response, add_special_tokens=False)
    assert batch["input_ids"][0, : len(row) + 1].tolist() == [*row, tokenizer.eos_token_id]
    prompt_length = len(tokenizer.encode(prompts[0], add_special_tokens=False))
    assert batch["input_ids"][0, prompt_length - 1].item() == newline[-1]  # the newline's token
    assert (batch["labels"][0, :prompt_length] == -100).all()
    assert batch["labels"][0, prompt_length].item() == row[prompt_length]  # the response starts
    assert formatted.key() != spec.key()
    other = dataclasses.replace(spec, prompts=(prompts[0][:-1], *prompts[1:]))
    assert other.key() != formatted.key()  # one prompt's newline changes the key
    assert formatted.parts()["prompts"]["first"] == list(prompts[:2])
    with pytest.raises(ValueError, match="63 formatted prompts for 64 training problems"):
        dataclasses.replace(spec, prompts=prompts[1:])
