"""Time of the report command on 10^5 rollouts (synthetic, two methods), in one run.

Baseline named in the output: reading the same files with ``json.loads`` per line, the floor
any report over them costs. Usage: ``python benchmarks/bench_report.py [--scale 3.9]``
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from nemo_mmpo.eval.report import load_runs, write_report
from nemo_mmpo.eval.synthetic import write_synthetic_runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=3.9, help="3.9: ~10^5 rollouts per run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        paths = write_synthetic_runs(Path(folder) / "runs", scale=args.scale)
        rollouts = sum(1 for path in paths for _ in path.open())
        start = time.perf_counter()
        for path in paths:
            with path.open() as handle:
                for line in handle:
                    json.loads(line)
        floor = time.perf_counter() - start
        start = time.perf_counter()
        write_report(
            load_runs([str(path) for path in paths], progress=False),
            Path(folder) / "report",
            progress=False,
        )
        seconds = time.perf_counter() - start
    print(f"rollouts={rollouts} (two runs)")
    print(f"json parse floor : {floor:6.2f} s")
    print(f"report           : {seconds:6.2f} s  ({seconds / floor:.1f}x the parse floor)")


if __name__ == "__main__":
    main()
