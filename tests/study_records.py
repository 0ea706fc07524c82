"""Hand-made study run records (what ``nemo_mmpo.study.comparison.read_run`` returns, the
numbers the report uses) for the report's and the check's tests."""

from __future__ import annotations

import numpy as np

from nemo_mmpo.cpu.rig.task import STRATA


def run_record(method: str, seed: int, success: list[float], never_solved: int) -> dict:
    """A run as :func:`nemo_mmpo.study.comparison.read_run` returns it (the numbers used)."""
    average = float(np.mean(success))
    numbers = {
        "accuracy": dict.fromkeys(STRATA, average),
        "average": average,
        "pass_at_k": {"pass@1": average, "pass@4": min(1.0, 2 * average)},
        "never_solved": never_solved,
        "problems": len(success),
        "first_success": [0.5, 0.5],
        "success": {f"{index}+1": value for index, value in enumerate(success)},
    }
    return {"method": method, "seed": seed, "selected": numbers, "final": numbers}
