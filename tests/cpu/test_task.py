"""The tiny task: strata, the stratified held-out split, records NeMo-RL and the evaluation read."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from nemo_mmpo.cpu.rig.model import char_tokenizer
from nemo_mmpo.cpu.rig.task import STRATA, AdditionTask, Problem, datum, write_benchmark_file
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.verify import grade_serially
from nemo_mmpo.settings import parse


@pytest.mark.parametrize(
    ("a", "b", "stratum"),
    [
        (3, 4, "one_digit"),
        (0, 9, "one_digit"),
        (12, 7, "mixed_digits"),
        (7, 90, "mixed_digits"),
        (12, 34, "two_digit_no_carry"),
        (15, 35, "two_digit_carry"),  # units carry
        (51, 60, "two_digit_carry"),  # tens carry (a three-digit sum)
        (99, 99, "two_digit_carry"),
    ],
)
def test_strata(a, b, stratum):
    assert Problem(a, b).stratum == stratum


def test_every_sum_below_100_falls_in_one_stratum_with_the_expected_counts():
    counts = Counter(Problem(a, b).stratum for a in range(100) for b in range(100))
    # two-digit pairs without any carry: 55 units pairs with sum < 10 x 36 tens pairs (1-9)
    assert counts == {
        "one_digit": 100,
        "mixed_digits": 1800,
        "two_digit_no_carry": 55 * 36,
        "two_digit_carry": 8100 - 55 * 36,
    }


def test_split_is_disjoint_stratified_and_seeded():
    task = AdditionTask(held_out_per_stratum=50, train_size=1500, split_seed=3)
    train, held_out = task.split()
    assert len(train) == 1500 and len(held_out) == 50 * len(STRATA)
    assert not {p.id for p in train} & {p.id for p in held_out}
    assert Counter(p.stratum for p in held_out) == dict.fromkeys(STRATA, 50)
    assert task.split() == (train, held_out)
    assert AdditionTask(held_out_per_stratum=50, train_size=1500, split_seed=4).split() != (
        train,
        held_out,
    )


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        ({"held_out_per_stratum": 100}, "task.held_out_per_stratum=100: give a value <= 99"),
        ({"held_out_per_stratum": 0}, "task.held_out_per_stratum=0: give a value >= 1"),
        ({"train_size": 10_000}, "train_size=10000 .* leaves room for 9760"),
        ({"train_size": "2000"}, "task.train_size='2000': give an integer"),
        ({"seed": 1}, "task.seed=1 is not a setting; known: held_out_per_stratum, split_seed"),
    ],
)
def test_impossible_splits_are_refused_by_name(settings, fragment):
    with pytest.raises(MMPOInputError, match=fragment):
        parse(AdditionTask, settings, "cpu_backend.task")


def test_the_warm_start_target_is_graded_correct_and_a_wrong_sum_is_not():
    """The supervised response is what NeMo-RL's Math-Verify environment rewards."""
    for a, b in ((3, 4), (47, 38), (99, 99)):
        problem = Problem(a, b)
        assert grade_serially(problem.answer, problem.response).correct
        assert not grade_serially(problem.answer, f"\\boxed{{{a + b + 1}}}").correct


def test_records_for_nemo_rl_and_the_held_out_benchmark_file(tmp_path):
    tokenizer = char_tokenizer()
    record = datum(tokenizer, Problem(47, 38), index=5)
    assert tokenizer.decode(record["message_log"][0]["token_ids"]) == "What is 47 + 38?"
    assert record["extra_env_info"] == {"ground_truth": "85"}
    assert record["length"] == len("What is 47 + 38?") and record["idx"] == 5
    path = write_benchmark_file(tmp_path / "held_out.jsonl", [Problem(1, 2), Problem(10, 90)])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[1] == {
        "id": "10+90",
        "problem": "What is 10 + 90?",
        "answer": "100",
        "source": "arithmetic",
        "stratum": "two_digit_carry",
    }
