"""The vLLM overlay's ``.pth`` line (``scripts/nemo_rl_env.sh``): it carries the CPU shims into the
processes vLLM's ``AsyncLLM`` spawns outside Ray, and into no other process. Run as Python runs
a ``.pth`` at interpreter start (``site.addsitedir``), in a fresh interpreter each time."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_mmpo.cpu.answers.vllm_shims import ENGINE_PROCESS_ENV

ROOT = Path(__file__).resolve().parents[1]
PROBE = (
    "import site, sys; site.addsitedir(sys.argv[1]); "
    "print('nemo_mmpo' in sys.modules, "
    "any(type(finder).__name__ == 'ShimOnImport' for finder in sys.meta_path))"
)


def pth_line() -> str:
    text = (ROOT / "scripts" / "nemo_rl_env.sh").read_text()
    (line,) = re.findall(r'^NEMO_MMPO_VLLM_SHIMS_PTH="(.*)"$', text, re.MULTILINE)
    return line


@pytest.mark.parametrize("engine_process", [False, True], ids=["any-process", "engine-process"])
def test_the_overlay_pth_installs_the_shims_only_where_the_async_worker_asked(
    tmp_path, engine_process
):
    line = pth_line()
    assert line.startswith("import ")  # Python runs a .pth line only if it starts so
    assert ENGINE_PROCESS_ENV in line
    (tmp_path / "_nemo_mmpo_vllm_shims.pth").write_text(line + "\n")
    environment = {k: v for k, v in os.environ.items() if k != ENGINE_PROCESS_ENV}
    environment["PYTHONPATH"] = str(ROOT)
    if engine_process:
        cluster = {"address": "127.0.0.1:6379", "namespace": "run"}
        environment[ENGINE_PROCESS_ENV] = json.dumps(cluster)
    printed = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path)],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert printed == [str(engine_process)] * 2
