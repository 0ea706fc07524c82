"""Compare NeMo-RL's unit-test outcomes without and with nemo-mmpo installed.

``python compare_outcomes.py BASE WITH [--exclude=tests/unit/x/test_a.py ...]``: BASE is a
JUnit XML report of the run without ``install()``, or a recorded baseline
(``baseline-<ref>.txt``); WITH is the JUnit XML report of the run with it. Tests in the
``--exclude`` files are left out of both. Prints one line (counts of each outcome and whether
they agree) and exits 1, listing every test whose outcome differs, if installing nemo-mmpo
changed any of them; exits 3 ("could not run") instead when every differing test is an error
with one and the same message (a start-up failure shared by the whole session, e.g. Ray's
dashboard timing out on a loaded machine, is not a change made by ``install()``):
``scripts/test_nemo_rl.sh`` then runs that session once more and says so.

``--rerun=RERUN.xml`` takes the outcomes of the tests in RERUN (those whose outcome differed,
run once more with ``install()``: ``python compare_outcomes.py --changed BASE WITH CHECKOUT``
prints their pytest ids) over WITH's, and the line says they ran again: a test that failed
once on a loaded machine (a 60 s join of spawned processes) is not a change made by
``install()``, and one that changed for real changes again.

``python compare_outcomes.py --record REPORT.xml BASELINE.txt ARCHIVE_SHA256`` writes a
baseline: NeMo-RL's outcomes for one snapshot, keyed by the snapshot archive's checksum, so that
CI (``scripts/test_nemo_rl.sh``) runs NeMo-RL's tests once per snapshot instead of twice. A
baseline whose checksum does not match the archive is ignored and both runs happen.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

CHECKSUM_PREFIX = "# archive sha256: "


#: exit status of a comparison whose run could not run (one shared start-up error), not changed
COULD_NOT_RUN = 3
#: how pytest's JUnit report begins the message of an error raised by a test's set-up (fixtures)
START_UP_ERROR = "failed on setup with"


def outcomes(path: str) -> dict[str, str]:
    """``{test id: passed | failure | error | skipped}`` from a JUnit report or a baseline."""
    if path.endswith(".txt"):
        lines = Path(path).read_text().splitlines()
        return dict(line.split("\t", 1)[::-1] for line in lines if not line.startswith("#"))
    return {name: outcome for name, (outcome, _) in _cases(path).items()}


def error_messages(path: str) -> dict[str, str]:
    """``{test id: message}`` of the tests of a JUnit report that ended in an error (a fixture
    or collection failure, as pytest reports them); none for a recorded baseline."""
    if path.endswith(".txt"):
        return {}
    return {
        name: message for name, (outcome, message) in _cases(path).items() if outcome == "error"
    }


def _cases(path: str) -> dict[str, tuple[str, str]]:
    results = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        children = {child.tag: child for child in case}
        outcome = next(
            (tag for tag in ("error", "failure", "skipped") if tag in children), "passed"
        )
        message = children[outcome].get("message", "") if outcome in children else ""
        results[name] = (outcome, message)
    return results


def baseline_checksum(path: str) -> str | None:
    """The archive checksum a baseline was recorded for (None if the file is missing)."""
    try:
        first = Path(path).read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    return first[len(CHECKSUM_PREFIX) :] if first.startswith(CHECKSUM_PREFIX) else None


def record(report: str, baseline: str, checksum: str) -> None:
    results = outcomes(report)
    lines = [f"{CHECKSUM_PREFIX}{checksum}"]
    lines += [f"{outcome}\t{name}" for name, outcome in sorted(results.items())]
    temporary = Path(f"{baseline}.tmp")
    temporary.write_text("\n".join(lines) + "\n")
    temporary.replace(baseline)


def summary(results: dict[str, str]) -> str:
    counts = Counter(results.values())
    return ", ".join(f"{counts[key]} {key}" for key in ("passed", "failure", "error", "skipped"))


def changed_tests(base_path: str, installed_path: str, excluded: list[str] = ()) -> list[str]:
    """The tests (JUnit names) outside the ``excluded`` files whose outcomes differ."""
    return _differing(*(_kept(outcomes(path), excluded) for path in (base_path, installed_path)))


def _differing(base: dict[str, str], installed: dict[str, str]) -> list[str]:
    return sorted(
        name for name in base.keys() | installed.keys() if base.get(name) != installed.get(name)
    )


def _kept(results: dict[str, str], excluded: list[str]) -> dict[str, str]:
    return {
        name: outcome
        for name, outcome in results.items()
        if not any(in_file(name, path) for path in excluded)
    }


def node_id(name: str, checkout: str) -> str:
    """pytest's id of JUnit test ``name`` (``tests.unit.x.test_a[.Class]::test[params]``),
    the module found as a file under ``checkout``."""
    dotted, test = name.split("::", 1)
    parts = dotted.split(".")
    for length in range(len(parts), 0, -1):
        module = "/".join(parts[:length]) + ".py"
        if (Path(checkout) / module).is_file():
            return "::".join([module, *parts[length:], test])
    raise ValueError(f"{name}: no module of it under {checkout}")


def compare(
    base_path: str, installed_path: str, excluded: list[str] = (), rerun_path: str | None = None
) -> int:
    """Every test of ``base`` outside the ``excluded`` files must have the same outcome. With
    ``rerun_path`` (a report of the tests whose outcome changed, run once more with
    ``install()``), their outcomes are those of the rerun, and the line says so."""
    base = _kept(outcomes(base_path), excluded)
    installed = outcomes(installed_path)
    if rerun_path is not None:
        first = _differing(base, _kept(installed, excluded))
        installed = {**installed, **outcomes(rerun_path)}
    installed = _kept(installed, excluded)
    changed = _differing(base, installed)
    if rerun_path is not None:
        if changed:
            print(
                f"outcomes CHANGED by install() for {len(changed)} test(s), also when run once "
                f"more ({summary(installed)}):"
            )
            for name in changed:
                print(f"  {name}: {base.get(name, 'absent')} -> {installed.get(name, 'absent')}")
            return 1
        print(
            f"same outcomes with and without install() ({summary(installed)}) once the "
            f"{len(first)} test(s) whose outcome differed on the first run ran again: "
            + "; ".join(f"{name} {base.get(name, 'absent')} on the rerun" for name in first)
        )
        return 0
    shared = shared_start_up_error(changed, error_messages(installed_path))
    if shared is not None:
        print(
            f"could not run: {len(changed)} test(s) errored with one and the same error before "
            f"running ({summary(installed)}), not a change made by install(): {shared}"
        )
        return COULD_NOT_RUN
    if changed:
        print(f"outcomes CHANGED by install() for {len(changed)} test(s) ({summary(installed)}):")
        for name in changed:
            print(f"  {name}: {base.get(name, 'absent')} -> {installed.get(name, 'absent')}")
        return 1
    print(f"same outcomes with and without install() ({summary(installed)})")
    return 0


def shared_start_up_error(changed: list[str], errors: dict[str, str]) -> str | None:
    """The one message every changed test errored with before it ran, where there is one: a
    session that could not start (every test's fixture failing the same way, as pytest's JUnit
    report words it: ``failed on setup with "..."``) rather than outcomes that changed. ``None``
    where a changed test passed, failed, was skipped or errored otherwise, or where the errors
    differ."""
    messages = {errors.get(name) for name in changed}
    if not changed or None in messages or len(messages) != 1:
        return None
    if not next(iter(messages)).startswith(START_UP_ERROR):
        return None
    (message,) = messages
    return " ".join(message.split())[:300] or "(no message)"


def in_file(name: str, path: str) -> bool:
    """Whether JUnit test ``name`` (``tests.unit.x.test_a[.Class]::test``) is in file ``path``."""
    module = path.removesuffix(".py").replace("/", ".")
    return name.startswith((f"{module}::", f"{module}."))


def main(arguments: list[str]) -> int:
    if arguments[:1] == ["--record"]:
        record(*arguments[1:4])
        return 0
    if arguments[:1] == ["--checksum"]:
        print(baseline_checksum(arguments[1]) or "")
        return 0
    if arguments[:1] == ["--changed"]:  # --changed BASE WITH CHECKOUT [--exclude=...]
        excluded = [
            item.split("=", 1)[1] for item in arguments[4:] if item.startswith("--exclude=")
        ]
        for name in changed_tests(arguments[1], arguments[2], excluded):
            print(node_id(name, arguments[3]))
        return 0
    excluded = [item.split("=", 1)[1] for item in arguments[2:] if item.startswith("--exclude=")]
    reruns = [item.split("=", 1)[1] for item in arguments[2:] if item.startswith("--rerun=")]
    return compare(arguments[0], arguments[1], excluded, reruns[0] if reruns else None)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
