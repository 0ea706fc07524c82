"""The README's usage example runs and prints the paper's worked values."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
#: details go to docs/ pages, linked (docs/install.md, ...): the README stays a page a user reads
README_LINES = 200


def python_blocks() -> list[str]:
    # the fence may carry a marker after the language (```python runnable: tests/test_docs.py)
    return re.findall(r"^```python[^\n]*\n(.*?)^```", README.read_text(), flags=re.DOTALL | re.M)


def test_estimator_usage_example_runs():
    block = next(block for block in python_blocks() if "mmpo_advantages" in block)
    assert len(block.strip().splitlines()) <= 10
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(block, str(README), "exec"), {})
    printed = output.getvalue()
    for value in ("4.4062", "-1.4688", "6.1224", "-1.4286"):
        assert value in printed


def test_the_readmes_pip_commands_paste(tmp_path):
    """Every ``pip install`` / ``pip wheel`` line of the README's bash blocks runs as printed,
    ``NEMO_MMPO`` (the one name marked as the user's) being a copy of this clone (a build
    writes beside its source, and other tests watch the checkout): pip accepts the source
    folder with its extras (a dry run, offline, no dependencies) and builds the wheel."""
    import os
    import shutil
    import subprocess
    import sys

    clone = tmp_path / "nemo-mmpo"
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        clone.mkdir(exist_ok=True)
        shutil.copy2(README.parent / name, clone / name)
    shutil.copytree(
        README.parent / "nemo_mmpo",
        clone / "nemo_mmpo",
        ignore=shutil.ignore_patterns("__pycache__"),
    )

    blocks = re.findall(r"^```bash[^\n]*\n(.*?)^```", README.read_text(), flags=re.DOTALL | re.M)
    lines = [
        line.split("#")[0].strip()
        for block in blocks
        for line in block.splitlines()
        if line.startswith(("pip install", "pip wheel"))
    ]
    assert any("[launch]" in line for line in lines) and any("wheel" in line for line in lines)
    pip = f"{sys.executable} -m pip"
    environment = dict(os.environ, NEMO_MMPO=str(clone), HOME=str(tmp_path))
    for line in lines:
        quiet = " --dry-run --no-deps --no-index --no-build-isolation -q"
        command = line.replace("pip install", f"pip install{quiet}", 1).replace(
            "pip wheel", "pip wheel --no-build-isolation -q", 1
        )
        done = subprocess.run(
            ["bash", "-c", command.replace("pip", pip, 1)],
            env=environment,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, (line, done.stderr[-2000:])
    assert list((tmp_path / "wheels").glob("nemo_mmpo-*.whl"))


def bash_lines() -> list[str]:
    """The README's bash blocks, one string a command (continuation lines joined)."""
    blocks = re.findall(r"^```bash[^\n]*\n(.*?)^```", README.read_text(), flags=re.DOTALL | re.M)
    return [
        command.strip()
        for block in blocks
        for command in block.replace("\\\n", " ").splitlines()
        if command.strip() and not command.lstrip().startswith("#")
    ]


def readme_yaml(name: str) -> str:
    """The README's YAML block whose first line names ``~/exp/<name>``."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", README.read_text(), flags=re.DOTALL | re.M)
    (block,) = [block for block in blocks if f"~/exp/{name}" in block.splitlines()[0]]
    return block


def test_the_readme_is_at_most_200_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= README_LINES, f"README.md has {lines} lines: move details to a docs/ page"


def test_the_readme_sets_nemo_rl_path_once_and_asks_uv_for_no_conflicting_extras():
    """``NEMO_RL_PATH`` is exported once, beside ``NEMO_MMPO``, and no command sets it again
    (``nemo-mmpo train``, ``eval watch`` and the Slurm scripts all read it); no command asks uv
    for NeMo-RL's ``vllm`` and ``mcore`` extras together (its pyproject.toml declares them
    conflicting: uv refuses)."""
    commands = bash_lines()
    exports = [line for line in commands if re.search(r"\bNEMO_RL_PATH=", line)]
    assert len(exports) == 1 and exports[0].startswith("export NEMO_MMPO="), exports
    for line in commands:
        assert not ("--extra vllm" in line and "--extra mcore" in line), line
    slurm = [line for line in commands if "/slurm/" in line]
    assert slurm and all("NEMO_RL_HOST_DIR=$NEMO_RL_PATH" in line for line in slurm), slurm


def test_the_readmes_answers_are_json_strings():
    """NeMo-RL's Math-Verify environment grades against ``"\\boxed{" + answer + "}"``: the
    README's example line is JSON whose answer is a string, and the README says so."""
    text = README.read_text()
    (example,) = re.findall(r"`(\{\"problem\": [^`]*\})`", text)
    assert isinstance(json.loads(example)["answer"], str)
    assert re.search(r"answer a JSON\s+string", text)


def test_the_readmes_docker_run_has_nemo_rls_documented_options():
    """Every option of the ``docker run`` in NeMo-RL's own README (the checkout the suite reads:
    ``--gpus all``, ``--shm-size``, ``--ulimit memlock``...) is in ours, but mounts, variables
    and the folder, which are the user's."""
    from nemo_rl_support import nemo_rl_checkout

    theirs = (nemo_rl_checkout() / "README.md").read_text()
    (run,) = [line for line in bash_lines() if line.startswith("docker run")]
    quick_start = theirs[theirs.index("docker run") :].split("```")[0]
    options = re.findall(r"(?:^|\s)(--?[a-z][\w-]*(?:[ =][^\s\\-][^\s\\]*)?)", quick_start)
    options = [o for o in options if o.split()[0].split("=")[0] not in ("-v", "-e", "-w")]
    assert {"--gpus all", "--shm-size=64g", "--ulimit memlock=-1"} <= set(options), options
    missing = [option for option in options if option not in run]
    assert not missing, (missing, run)


def test_the_readmes_recipe_passes_the_dry_run_and_keeps_every_checkpoint(tmp_path):
    """The README's recipe in a folder with the files it names passes the dry run (NeMo-RL's
    loader and ``MasterConfig``, from the checkout ``NEMO_RL_PATH`` names) without a warning,
    and its checkpoints suit the watcher: no ``val:`` metric to rank by (``val_period: 0``
    collects none, and NeMo-RL warns at every save), every checkpoint kept (``keep_top_k`` an
    integer: ``MasterConfig`` refuses null)."""
    import sys

    import patience
    from nemo_rl_support import nemo_rl_checkout

    from nemo_mmpo.recipes import load

    root = nemo_rl_checkout()
    (tmp_path / "my_recipe.yaml").write_text(readme_yaml("my_recipe.yaml"))
    for name in ("my_problems.jsonl", "my_held_out.jsonl"):
        (tmp_path / name).write_text(json.dumps({"problem": "What is 2 + 3?", "answer": "5"}))
    (tmp_path / "my_prompt.txt").write_text("{}\n")
    config = load(tmp_path / "my_recipe.yaml", nemo_rl_root=root).config
    checkpointing = config["checkpointing"]
    assert checkpointing["enabled"] and checkpointing["metric_name"] is None, checkpointing
    saves = config["grpo"]["max_num_steps"] // checkpointing["save_period"]
    assert isinstance(checkpointing["keep_top_k"], int) and checkpointing["keep_top_k"] >= saves
    planned = patience.run(
        [sys.executable, "-m", "nemo_mmpo.cli", "train", "--config", "my_recipe.yaml", "--dry-run"],
        cwd=tmp_path,
        env=dict(os.environ, NEMO_RL_PATH=str(root)),
        capture_output=True,
        text=True,
        timeout=patience.COMMAND_S,
    )
    assert planned.returncode == 0, planned.stdout[-2000:] + planned.stderr[-2000:]
    assert "WARNING" not in planned.stdout + planned.stderr, planned.stdout + planned.stderr
