"""The CPU rehearsal's warm start learns the recipe's prompts as NeMo-RL formats them.

A user who copies the README's recipe writes ``my_prompt.txt`` as editors do: ``{}`` then a
newline. NeMo-RL's data setup (``setup_response_data``, the math data processor, the rig's
chat template) gives the policy ``What is 2 + 3?`` and the newline's token; a warm start on
the bare sums never saw that token, and the rehearsal's reward was 0 at every step. Here the
user's folder is the README's (its two YAML blocks, a JSONL of sums, the prompt file with its
newline), read by NeMo-RL's own data setup as a run reads it, and the warm start made as the
run makes it (:func:`~nemo_mmpo.cpu.rig.policy_start.policy_model`'s spec, ``load_or_make``),
small and with a loose band (CPU time: ~10 s)."""

from __future__ import annotations

import dataclasses

import pytest
from nemo_rl_support import import_nemo_rl, nemo_rl_checkout
from readme_recipe_files import TRAIN, problems, readme_file

from nemo_mmpo.cpu.rig import warm_start as warm_start_module
from nemo_mmpo.cpu.rig.policy_start import recipe_task_start, warm_start_prompts
from nemo_mmpo.cpu.rig.rig_settings import TinySettings
from nemo_mmpo.cpu.rig.task import Problem
from nemo_mmpo.cpu.rig.warm_start import load_or_make
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.recipes import load

pytestmark = [pytest.mark.nemo_rl]
import_nemo_rl("nemo_rl.data.utils")

#: a small warm start with a loose band (as test_warm_start's real one): the band's end is
#: reached by construction, or the warm start raises at its cap
SMALL = [
    "++cpu_backend.model.hidden_size=64",
    "++cpu_backend.task.train_size=256",
    "++cpu_backend.warm_start.target_low=0.02",
    "++cpu_backend.warm_start.target_high=0.9",
    "++cpu_backend.warm_start.learning_rate=3.0e-3",
    "++cpu_backend.warm_start.batch_size=64",
    "++cpu_backend.warm_start.check_every=50",
    "++cpu_backend.warm_start.check_prompts=48",
    "++cpu_backend.warm_start.max_steps=1500",
    "++cpu_backend.warm_start_cache=null",
]


def users_recipe(folder, monkeypatch, prompt: str, overrides=()) -> dict:
    """The README's recipe and CPU file in ``folder`` with the user's sums and ``prompt`` as
    ``my_prompt.txt``, loaded (NeMo-RL's bases from its checkout) from there as a run does."""
    nemo_rl_checkout()
    folder.mkdir()
    (folder / "my_recipe.yaml").write_text(readme_file("my_recipe.yaml"))
    (folder / "my_recipe_cpu.yaml").write_text(readme_file("my_recipe_cpu.yaml"))
    (folder / "my_problems.jsonl").write_text(problems(TRAIN))
    (folder / "my_held_out.jsonl").write_text(problems(TRAIN[:2]))
    (folder / "my_prompt.txt").write_text(prompt)
    monkeypatch.chdir(folder)
    return load("my_recipe_cpu.yaml", list(overrides)).config


def test_the_warm_start_measures_its_band_on_the_sums_as_nemo_rl_formats_the_users_prompt(
    tmp_path, monkeypatch
):
    config = users_recipe(tmp_path / "exp", monkeypatch, "{}\n", SMALL)
    settings = TinySettings.from_config(config["cpu_backend"])
    tokenizer, records, sums = recipe_task_start(settings, config["data"])
    # NeMo-RL's setup gives the policy each of the user's sums with the newline's token (the
    # unknown one: no printable character), and formats the rig's sums to the same tokens
    unknown = tokenizer.unk_token_id
    given = {record["extra_env_info"]["ground_truth"]: record for record in records}
    assert len(given) == len(TRAIN)
    for (a, b), text in zip(TRAIN, sums([Problem(a, b) for a, b in TRAIN]), strict=True):
        tokens = given[str(a + b)]["message_log"][0]["token_ids"].tolist()
        assert tokens[-1] == unknown and unknown not in tokens[:-1], tokens
        assert tokenizer.encode(text, add_special_tokens=False) == tokens
    prompts = warm_start_prompts(settings, sums)
    assert prompts is not None and len(prompts) == settings.task.train_size

    measured = []  # the prompts of every measurement of the band

    def success_rate(model, tokenizer, problems, samples, sampler):
        measured.append([problem.prompt for problem in problems])
        return real_success_rate(model, tokenizer, problems, samples, sampler)

    real_success_rate = warm_start_module.success_rate
    monkeypatch.setattr(warm_start_module, "success_rate", success_rate)
    spec = settings.warm_start_spec(config["policy"]["generation"], prompts)
    _, result, _ = load_or_make(spec, tokenizer, None, log=lambda message: None)
    low, high = settings.warm_start.target_low, settings.warm_start.target_high
    assert low <= result.success <= high and result.steps < settings.warm_start.max_steps
    check = settings.warm_start.check_prompts
    assert measured and all(seen == list(prompts[:check]) for seen in measured)
    # the warm start's cache key is not the bare sums' (the rig's own warm start)
    assert spec.key() != dataclasses.replace(spec, prompts=None).key()


@pytest.mark.parametrize(
    ("prompt", "own"),
    [
        ("{}", False),  # the sums as they are: the rig's own warm start (CI's shared one)
        ("{}\n\n", True),  # two newlines: two unknown tokens, another warm start than one's
        ("Q: {}\n", True),
    ],
)
def test_each_formatting_has_its_own_warm_start(tmp_path, monkeypatch, prompt, own):
    """The cache key follows what the warm start learns from: the prompts NeMo-RL formats."""
    config = users_recipe(tmp_path / "exp", monkeypatch, prompt)
    settings = TinySettings.from_config(config["cpu_backend"])
    tokenizer, _, sums = recipe_task_start(settings, config["data"])
    prompts = warm_start_prompts(settings, sums)
    generation = config["policy"]["generation"]
    keys = {
        "own": settings.warm_start_spec(generation, prompts).key(),
        "bare": settings.warm_start_spec(generation).key(),
    }
    assert (keys["own"] != keys["bare"]) == own
    if own:
        first = settings.task.split()[0][0].prompt
        assert prompts[0] == prompt.replace("{}", first)
        newlines = prompt.count("\n")
        assert (
            tokenizer.encode(prompts[0], add_special_tokens=False)[-newlines:]
            == [tokenizer.unk_token_id] * newlines
        )


def test_a_prompt_that_nemo_rl_cuts_is_refused_in_one_line(tmp_path, monkeypatch):
    """NeMo-RL's processor cuts a prompt of ``data.max_input_seq_length`` tokens or more to 4
    and masks it: the warm start would learn the cut text, so it refuses, naming the key."""
    prompt = "Give the sum in \\boxed{{}}: {}\n"
    config = users_recipe(tmp_path / "exp", monkeypatch, prompt)
    settings = TinySettings.from_config(config["cpu_backend"])
    _, _, sums = recipe_task_start(settings, config["data"])
    with pytest.raises(MMPOInputError, match=r"not under data.max_input_seq_length=24, and cuts"):
        warm_start_prompts(settings, sums)
