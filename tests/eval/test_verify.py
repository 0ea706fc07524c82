"""The verifier: a table of pairs that must and must not match, and the hard budget."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("math_verify", reason="the eval extra (math-verify) is not installed")

from nemo_mmpo.eval.verify import Verdict, VerifierPool, grade_serially

MUST_MATCH = [
    ("\\frac{1}{2}", "The answer is \\boxed{0.5}."),
    ("25", "so we get $\\boxed{25}$"),
    ("25", "\\boxed{025}"),
    ("27", "\\boxed{27.0}"),
    ("\\sqrt{2}", "\\boxed{\\sqrt{2}}"),
    ("x^2+1", "\\boxed{1 + x^2}"),
    ("(1,2)", "\\boxed{(1, 2)}"),
]
MUST_NOT_MATCH = [
    ("\\frac{1}{2}", "\\boxed{0.25}"),
    ("25", "\\boxed{26}"),
    ("3", "I could not solve it."),
    ("\\sqrt{2}", "\\boxed{2}"),
]
PATHOLOGICAL = "\\boxed{9^{9^{9^{9^{9}}}}}"


#: the hard budget the cut-off test checks; the verdict tests get a budget no loaded machine
#: reaches (a fresh worker's first answers were over 2 s beside CI's other jobs: "timeout",
#: counted incorrect, failed the table in a fresh-clone CI of 2346220)
BUDGET_SECONDS = 2.0


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(num_workers=2, timeout_seconds=120.0, max_chars=2000) as verifier_pool:
        yield verifier_pool


@pytest.fixture
def budget_pool():
    with VerifierPool(
        num_workers=2, timeout_seconds=BUDGET_SECONDS, max_chars=2000
    ) as verifier_pool:
        yield verifier_pool


def test_matching_table(pool):
    pairs = MUST_MATCH + MUST_NOT_MATCH
    verdicts = pool.verify([gold for gold, _ in pairs], [prediction for _, prediction in pairs])
    assert [verdict.correct for verdict in verdicts] == [True] * len(MUST_MATCH) + [False] * len(
        MUST_NOT_MATCH
    )
    assert all(verdict.status == "ok" for verdict in verdicts)


def test_a_hanging_answer_is_cut_off_and_the_pool_keeps_working(budget_pool):
    pool = budget_pool
    pool.verify(["1", "2"], ["\\boxed{1}", "\\boxed{2}"])  # both workers started and ready
    start = time.monotonic()
    replaced_before = pool.replaced_workers
    replacing_before = pool.seconds_replacing
    verdicts = pool.verify(["3", "2", "4"], [PATHOLOGICAL, "\\boxed{2}", "\\boxed{4}"])
    elapsed = time.monotonic() - start
    # "timeout", not Math-Verify's own ("ok", False) after its 5 s alarm: our budget cut it off
    assert verdicts == [Verdict(False, "timeout"), Verdict(True), Verdict(True)]
    # the budget, then the replacement worker's start (Math-Verify's import: seconds on a loaded
    # CI machine, so measured rather than assumed), then two trivial answers
    restart = pool.seconds_replacing - replacing_before
    assert elapsed - restart < BUDGET_SECONDS + 2.0
    assert pool.replaced_workers == replaced_before + 1
    assert pool.verify(["7"], ["\\boxed{7}"]) == [Verdict(True)]
    assert pool.counts["timeout"] >= 1


def test_nothing_raised_escapes(pool):
    verdicts = pool.verify(["1", "\\frac{", "2"], ["\\boxed{", "\\boxed{1}", "x" * 5000])
    assert [verdict.correct for verdict in verdicts] == [False, False, False]
    assert verdicts[2].status == "too_long"


def test_serial_grader_agrees_on_the_table():
    for gold, prediction in MUST_MATCH[:3] + MUST_NOT_MATCH[:2]:
        expected = (gold, prediction) in MUST_MATCH
        assert grade_serially(gold, prediction).correct is expected


def test_mismatched_lengths_are_an_error(pool):
    from nemo_mmpo import MMPOInputError

    with pytest.raises(MMPOInputError, match="2 gold answers but 1 predictions"):
        pool.verify(["1", "2"], ["1"])


def test_a_dead_worker_is_replaced_and_nothing_escapes(pool):
    pool.workers[0].process.kill()
    pool.workers[0].process.join(timeout=5)
    verdicts = pool.verify(["1", "2", "3"], ["\\boxed{1}", "\\boxed{2}", "\\boxed{4}"])
    assert [verdict.correct for verdict in verdicts] == [True, True, False]
    assert all(verdict.status == "ok" for verdict in verdicts)
    assert all(worker.process.is_alive() for worker in pool.workers)
