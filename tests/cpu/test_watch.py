"""The checkpoint watcher where NeMo-RL's workers run, and on a live tiny run, killed and
restarted.

Where NeMo-RL's workers run: the interpreters NeMo-RL gives its vLLM and Megatron workers,
found as NeMo-RL finds them (``nemo_mmpo.eval.worker_environments``). With
``NEMO_RL_PY_EXECUTABLES_SYSTEM=1`` (these suites' setting) both are this interpreter. Without
it, as in NeMo-RL's container, each is ``NEMO_RL_VENV_DIR/<actor class path>``: here a real
environment placed there (its site-packages this environment's, by a ``.pth`` file) is found by
NeMo-RL's own ``_env_builder`` as it is, with a ``uv`` on ``PATH`` that records being called and
fails (nothing is synced); a missing one is built by NeMo-RL's ``create_local_venv`` (the same
``uv``: its failure is one line). NeMo-RL's registry reads the switch when it is imported, so
those cases run in a fresh process. The converter of a Megatron checkpoint runs with the
Megatron worker's interpreter, nemo-mmpo reached there on ``PYTHONPATH``.

With vLLM's CPU build in such an environment, the watcher samples a checkpoint there and its
own process imports neither vLLM nor Megatron. On a live run: the watcher evaluates each
checkpoint once, as it appears, and loses and repeats
no sample.

A tiny CPU run trains in one process (NeMo-RL's ``grpo_train``, a checkpoint every 5 steps, no
in-loop evaluation); ``nemo-mmpo eval watch --follow --backend hf`` starts beside it before the
first checkpoint exists, and is killed with SIGKILL in the middle of its work (a step's rollouts
half written) and started again, twice. At the end every checkpoint's step is evaluated exactly
once: every (problem, sample) of each step appears once, each step's numbers equal what the
report computes from its rollouts, TensorBoard has each step, and ``best/`` holds the weights of
the step the paper's rule selects.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
import venv
from pathlib import Path

import in_loop_evaluation
import patience
import pytest
from nemo_rl_support import CONFIGS_DIR, import_nemo_rl

pytestmark = pytest.mark.nemo_rl
import_nemo_rl("nemo_rl.algorithms.grpo")

from nemo_mmpo.cpu.spread.curves import reward_curve
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval import worker_environments
from nemo_mmpo.eval.convert import CONVERTER
from nemo_mmpo.eval.protocol import read_steps
from nemo_mmpo.eval.rollouts import load_run
from nemo_mmpo.eval.worker_environments import (
    MEGATRON_WORKER,
    VLLM_WORKER,
    uv_environment_python,
    worker_python,
)

ROOT = CONFIGS_DIR.parents[1]
PROBLEMS, SAMPLES, STEPS = 240, 2, 15


def overrides(tmp_path: Path, warm_starts: Path) -> list[str]:
    return [
        f"grpo.max_num_steps={STEPS}",
        "grpo.val_period=0",
        "grpo.val_at_start=false",
        "evaluation.in_loop=false",
        f"evaluation.samples={SAMPLES}",
        f"evaluation.output_dir={tmp_path / 'evaluation'}",
        "checkpointing.save_period=5",
        "checkpointing.keep_top_k=1000",
        "checkpointing.metric_name=null",
        f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
        f"logger.log_dir={tmp_path / 'logs'}",
        f"cpu_backend.warm_start_cache={warm_starts}",
    ]


def start_watcher(tmp_path: Path, warm_starts: Path) -> subprocess.Popen:
    """The watcher as a user starts it beside a live run: following its checkpoints."""
    follow = ["--backend", "hf", "--follow", "--poll-seconds", "0.5", "--idle-seconds", "600"]
    recipe = CONFIGS_DIR / "mmpo_tiny_cpu.yaml"
    return in_loop_evaluation.start_watcher(
        recipe, follow, overrides(tmp_path, warm_starts), tmp_path / "watch.log"
    )


def half_written_step(evaluation: Path) -> int | None:
    """A step whose rollouts have lines but whose numbers are not written yet."""
    for rollouts in evaluation.glob("step_*.jsonl"):
        step = int(rollouts.stem.removeprefix("step_"))
        if rollouts.stat().st_size > 0 and not (evaluation / f"step_{step}.json").exists():
            return step
    return None


@pytest.mark.one_snapshot
# CI time: in CI the watcher is killed mid-step and resumed on the Megatron recipe's NeMo-RL
# checkpoint with vLLM (tests/cpu/test_tiny_run_megatron.py), and its follow loop runs on
# recorded engines (tests/eval/test_watch_engines.py); this live run on request
@pytest.mark.beyond_ci
def test_the_watcher_survives_kill_9_and_evaluates_every_checkpoint_once(
    tmp_path, tiny_warm_starts
):
    evaluation = tmp_path / "evaluation"
    watcher = start_watcher(tmp_path, tiny_warm_starts)  # before training: nothing to evaluate
    training = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "examples" / "run_mmpo_math.py"),
            "--config",
            str(CONFIGS_DIR / "mmpo_tiny_cpu.yaml"),
            *overrides(tmp_path, tiny_warm_starts),
        ],
        cwd=ROOT,
        env=in_loop_evaluation.user_environment(),
        stdout=open(tmp_path / "training.log", "w"),
        stderr=subprocess.STDOUT,
    )
    kills, deadline = [], time.monotonic() + patience.RUN_S
    try:
        while len(kills) < 2 and time.monotonic() < deadline and watcher.poll() is None:
            step = half_written_step(evaluation)
            if step is not None and step not in kills:
                watcher.send_signal(signal.SIGKILL)
                watcher.wait()
                kills.append(step)
                watcher = start_watcher(tmp_path, tiny_warm_starts)
            time.sleep(0.05)
        assert training.wait(timeout=patience.RUN_S) == 0, (tmp_path / "training.log").read_text()[
            -3000:
        ]
        assert watcher.wait(timeout=patience.RUN_S) == 0, (tmp_path / "watch.log").read_text()[
            -3000:
        ]
    finally:
        for process in (watcher, training):
            if process.poll() is None:
                process.kill()
    assert kills, "the watcher was never caught half-way through a step"

    steps = read_steps(evaluation)
    assert sorted(steps) == [5, 10, 15]
    for step, numbers in steps.items():
        lines = [json.loads(line) for line in (evaluation / f"step_{step}.jsonl").open()]
        keys = [(line["problem_id"], line["sample"]) for line in lines]
        assert len(keys) == len(set(keys)) == PROBLEMS * SAMPLES  # none lost, none repeated
        counts = load_run([evaluation / f"step_{step}.jsonl"])
        assert numbers["accuracy"] == pytest.approx(counts.correct.sum() / counts.samples.sum())
        assert numbers["tensorboard"] is True
        logged = dict(reward_curve(tmp_path / "logs", "validation/paper/average"))
        assert logged[step] == pytest.approx(numbers["average"])
    best = max(steps.values(), key=lambda entry: (entry["average"], -entry["step"]))
    marker = json.loads((evaluation / "best" / "nemo_mmpo_best.json").read_text())
    assert marker["step"] == best["step"] and (evaluation / "best" / "config.json").is_file()
    summary = json.loads((evaluation / "run_summary.json").read_text())
    assert summary["selected"]["step"] == best["step"] and summary["final"]["step"] == STEPS


def test_both_snapshots_register_the_worker_classes_the_watcher_names():
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY

    assert {VLLM_WORKER, MEGATRON_WORKER} <= set(ACTOR_ENVIRONMENT_REGISTRY)
    with pytest.raises(MMPOInputError, match=r"no environment for nemo_rl\.NotAWorker"):
        worker_python("nemo_rl.NotAWorker")


def test_one_environment_for_every_process_with_nemo_rls_switch():
    assert os.environ["NEMO_RL_PY_EXECUTABLES_SYSTEM"] == "1"
    assert worker_python(VLLM_WORKER) == worker_python(MEGATRON_WORKER) == sys.executable


def worker_venv(venvs: Path, actor_class_path: str) -> Path:
    """A real environment at ``venvs/<actor class path>`` whose packages are this one's."""
    folder = venvs / actor_class_path
    venv.create(folder, with_pip=False, symlinks=True)
    packages = folder / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    (packages / "site-packages" / "this_environment.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"
    )
    return folder / "bin" / "python"


@pytest.fixture
def uv_that_fails(tmp_path) -> tuple[Path, dict[str, str]]:
    """``(its record, an environment without NeMo-RL's switch, NEMO_RL_VENV_DIR`` a folder of
    this test, and a ``uv`` first on ``PATH`` that records its arguments and fails)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    record = tmp_path / "uv-calls"
    (tools / "uv").write_text(f'#!/bin/sh\necho "$@" >> {record}\nexit 1\n')
    (tools / "uv").chmod(0o755)
    environment = {key: value for key, value in os.environ.items() if key != "NEMO_RL_VENV_DIR"}
    environment.pop("NEMO_RL_PY_EXECUTABLES_SYSTEM")
    environment.update(
        NEMO_RL_VENV_DIR=str(tmp_path / "venvs"), PATH=f"{tools}{os.pathsep}{environment['PATH']}"
    )
    return record, environment


def in_fresh_process(program: str, environment: dict[str, str]) -> dict:
    """``program``'s last line of output, read as JSON (NeMo-RL's registry imported anew)."""
    done = subprocess.run(
        [sys.executable, "-c", program], env=environment, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


FIND_BOTH = """
import json, sys
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.worker_environments import MEGATRON_WORKER, VLLM_WORKER, worker_python
found = {}
for name in (VLLM_WORKER, MEGATRON_WORKER):
    try:
        found[name] = worker_python(name)
    except MMPOInputError as error:
        found[name] = "error: " + str(error)
print(json.dumps(found))
"""


def test_a_prebuilt_worker_environment_is_used_as_it_is(tmp_path, uv_that_fails):
    record, environment = uv_that_fails
    vllm = worker_venv(tmp_path / "venvs", VLLM_WORKER)
    megatron = worker_venv(tmp_path / "venvs", MEGATRON_WORKER)
    found = in_fresh_process(FIND_BOTH, environment)
    assert found == {VLLM_WORKER: str(vllm), MEGATRON_WORKER: str(megatron)}
    assert not record.exists()  # nothing synced, nothing built


def test_a_missing_worker_environment_is_built_by_nemo_rl_and_its_failure_is_one_line(
    tmp_path, uv_that_fails
):
    record, environment = uv_that_fails
    worker_venv(tmp_path / "venvs", MEGATRON_WORKER)
    found = in_fresh_process(FIND_BOTH, environment)
    assert found[MEGATRON_WORKER] == str(tmp_path / "venvs" / MEGATRON_WORKER / "bin" / "python")
    message = found[VLLM_WORKER]
    assert message.startswith(f"error: NeMo-RL's environment for {VLLM_WORKER} is not in ")
    assert "prefetch_venvs.py" in message and "\n" not in message
    assert record.read_text().startswith("venv --allow-existing")  # create_local_venv's uv
    assert not (tmp_path / "venvs" / VLLM_WORKER / "STARTED_ENV_BUILDER").exists()


def test_without_rays_task_function_the_same_decision(tmp_path, monkeypatch):
    """A Ray whose remote functions do not keep ``_function``: the existing environment."""
    from nemo_rl.utils import venvs

    python = worker_venv(tmp_path, VLLM_WORKER)
    monkeypatch.setattr(venvs, "_env_builder", object())
    monkeypatch.setenv("NEMO_RL_VENV_DIR", str(tmp_path))
    assert uv_environment_python("uv run --extra vllm", VLLM_WORKER) == str(python)


def test_the_converter_runs_with_the_megatron_workers_interpreter(tmp_path, uv_that_fails):
    """NeMo-RL's converter (a stand-in that writes what ran it) in the Megatron worker's
    environment, nemo-mmpo on its PYTHONPATH (the setup functions import it there)."""
    _, environment = uv_that_fails
    python = worker_venv(tmp_path / "venvs", MEGATRON_WORKER)
    nemo_rl = tmp_path / "nemo-rl"
    (nemo_rl / CONVERTER).parent.mkdir(parents=True)
    (nemo_rl / CONVERTER).write_text(
        "import json, os, sys\n"
        "out = sys.argv[sys.argv.index('--hf-ckpt-path') + 1]\n"
        "os.makedirs(out)\n"
        "json.dump({'python': sys.executable}, open(os.path.join(out, 'config.json'), 'w'))\n"
    )
    step = tmp_path / "step_5"
    (step / "policy" / "weights" / "iter_0000005").mkdir(parents=True)
    (step / "config.yaml").write_text("policy: {}\n")
    # nemo-mmpo on the watcher's sys.path, not on PYTHONPATH: the converter's process gets it
    # from the watcher alone
    inherited = environment.get("PYTHONPATH", "").split(os.pathsep)
    environment["PYTHONPATH"] = os.pathsep.join(entry for entry in inherited if entry != str(ROOT))
    program = (
        f"import json, sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom pathlib import Path\n"
        "from nemo_mmpo.eval.convert import megatron_to_hugging_face\n"
        f"out = megatron_to_hugging_face(Path({str(step)!r}), Path({str(tmp_path / 'hf')!r}), "
        f"Path({str(nemo_rl)!r}))\n"
        "print(json.dumps(json.loads((out / 'config.json').read_text())))\n"
    )
    assert in_fresh_process(program, environment) == {"python": str(python)}


def test_worker_environment_reaches_nemo_mmpo_and_names_the_environment(tmp_path, monkeypatch):
    python = str(worker_venv(tmp_path, VLLM_WORKER))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("VIRTUAL_ENV", "/the-drivers")
    environment = worker_environments.worker_environment(python)
    assert environment["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/elsewhere"]
    assert environment["VIRTUAL_ENV"] == str(tmp_path / VLLM_WORKER)
    assert environment["UV_PROJECT_ENVIRONMENT"] == str(tmp_path / VLLM_WORKER)
    assert worker_environments.worker_environment(sys.executable)["VIRTUAL_ENV"] == "/the-drivers"


WATCH_AND_CHECK_IMPORTS = """
import sys
from nemo_mmpo.eval.__main__ import main
main(sys.argv[1:])
engines = sorted({name.split('.')[0] for name in sys.modules} & {'vllm', 'megatron'})
assert not engines, f'the watcher imported {engines}'
print('watch: imported neither vllm nor megatron')
"""


@pytest.mark.alternating  # a vLLM engine start (about a minute on 2 cores): one snapshot a commit
def test_vllm_samples_in_the_vllm_workers_environment_never_in_the_watchers(
    tmp_path, uv_that_fails
):
    """``eval watch --backend vllm`` where NeMo-RL's vLLM worker has an environment of its own:
    vLLM's CPU build samples a checkpoint there, and the watcher's process imports neither vLLM
    nor Megatron."""
    from nemo_mmpo.cpu.rig.model import ModelShape, char_tokenizer, tiny_llama

    import_nemo_rl("vllm")
    _, environment = uv_that_fails
    python = worker_venv(tmp_path / "venvs", VLLM_WORKER)
    weights = tmp_path / "checkpoints" / "step_2" / "policy" / "weights"
    tokenizer = char_tokenizer()
    tiny_llama(tokenizer, ModelShape(), seed=0).save_pretrained(weights)
    tokenizer.save_pretrained(weights)
    (weights.parent.parent / "training_info.json").write_text(json.dumps({"step": 2}))
    held_out = tmp_path / "checkpoints" / "held_out.jsonl"  # the recipe's benchmark, as the rig's
    held_out.write_text(
        "".join(json.dumps({"problem": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(4))
    )
    arguments = [
        "watch",
        "--config",
        str(CONFIGS_DIR / "mmpo_tiny_cpu_vllm.yaml"),  # vLLM's CPU settings: its KV cache
        "--backend",
        "vllm",
        "--every",
        "2",
        "grpo.max_num_steps=2",
        "evaluation.samples=2",
        "evaluation.template='{}'",
        "evaluation.max_new_tokens=4",
        f"evaluation.output_dir={tmp_path / 'evaluation'}",
        f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
        f"logger.log_dir={tmp_path / 'logs'}",
    ]
    done = subprocess.run(
        [sys.executable, "-c", WATCH_AND_CHECK_IMPORTS, *arguments],
        env=environment,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"watch: vLLM samples in {python} " in done.stdout
    assert "imported neither vllm nor megatron" in done.stdout
    rollouts = read_steps(tmp_path / "evaluation")[2]
    assert rollouts["step"] == 2
