"""The async tiny recipe on a Ray cluster of two nodes, each started with ``ray start``.

A head (custom resource ``head_node``) and a worker (``worker_node``) run on this machine as
separate Ray nodes, each its own ``ray start --block`` process group (killing the group is a
machine that died). The recipe's ``cpu_backend.placement`` puts the generation engine and
NeMo-RL's math environment on the worker node; the driver (the policy) is on the head. One
run's life, and what holds by construction:

- it trains and checkpoints; Ray's actor table records the engine and the environment on the
  worker node's id;
- the worker node killed mid-run ends the run within a bounded time with an error naming the
  node and the checkpoint (the driver's node watch: NeMo-RL's async loop alone would wait for
  trajectories forever);
- with a new worker node, the same command resumes from that checkpoint and finishes; the
  engine, on the new worker, ends holding the policy's final weights, so every refit crossed
  from the head's object store to the worker's.

Every wait is bounded. Ray's health checks are shortened on the head so that a dead node is
noticed within seconds (defaults: about 15 s).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from nemo_rl_support import CONFIGS_DIR, Console, import_nemo_rl

# CI time: on request (NEMO_MMPO_BEYOND_CI=1). In CI, Ray spans two hosts in the Slurm suite
# (both snapshots' ray.sub: the environment on node2, node2 lost, a bounded end naming it and
# the checkpoint, resumed with no step twice) and the driver's node watch ends a wait inside
# ray.get on a stand-in node table (test_node_watch.py)
pytestmark = [pytest.mark.nemo_rl, pytest.mark.one_snapshot, pytest.mark.beyond_ci]
grpo = import_nemo_rl("nemo_rl.algorithms.grpo")

from nemo_mmpo.cpu.engines.generation import SeparateCPUGeneration
from nemo_mmpo.cpu.engines.policy import CPUPolicy
from nemo_mmpo.cpu.rig import driver
from nemo_mmpo.nemo_rl.versions import async_resume_can_stall
from nemo_mmpo.recipes import load

ROOT = CONFIGS_DIR.parents[1]
#: the CLI of the Ray this interpreter imports, run by it (a vLLM overlay environment reaches
#: its base's Ray through a .pth and has no ``bin/ray`` of its own)
RAY = [sys.executable, "-m", "ray.scripts.scripts"]
ASYNC_RECIPE = "mmpo_tiny_cpu_async.yaml"
ON_WORKER = "{resources: {worker_node: 0.01}}"
#: NeMo-RL's actors (trajectory collector, replay buffer, verifier) take 1 logical CPU each.
LOGICAL_CPUS = 4
#: Ray's node health checks on the head: a node that stops answering is dead within ~2 s.
FAST_HEALTH_CHECKS = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


def wait_for(condition, seconds: float, what: str):
    """Poll ``condition`` until it returns something true; fail naming ``what`` after
    ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.5)
    pytest.fail(f"timed out after {seconds} s waiting for {what}")


class RayNode:
    """``ray start --block`` in its own process group: killing the group kills the node."""

    def __init__(self, name: str, base: Path, arguments: list[str], environment: dict) -> None:
        self.name = name
        self.temp_dir = base / name
        self.log = base / f"{name}.log"
        command = [*RAY, "start", "--block", "--disable-usage-stats"]
        command += [f"--temp-dir={self.temp_dir}", f"--num-cpus={LOGICAL_CPUS}", *arguments]
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,
            )

    def check_running(self) -> None:
        """Fail with the node's own output if ``ray start`` has exited."""
        if self.process.poll() is not None:
            pytest.fail(f"ray start ({self.name}) exited:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL to every process of the node (a machine that died)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """``ray start --block`` stops its processes on SIGTERM; the rest is killed."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


class TwoNodes:
    """A head and a worker node on this machine, and this process connected as a driver."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.head = self.worker = None
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        import ray

        # Ray's workers import nemo_rl, nemo_mmpo and the tests' helpers (NeMo-RL hands its
        # actors the driver's environment; the nodes' own workers get the nodes')
        path = os.pathsep.join([str(ROOT / "tests"), str(ROOT), *sys.path])
        self.environment = {**os.environ, "PYTHONPATH": path, **FAST_HEALTH_CHECKS}
        self.environment.pop("RAY_ADDRESS", None)
        with socket.socket() as probe:  # a free port for the head's GCS
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        head = ["--head", f"--port={port}", "--include-dashboard=false"]
        head.append('--resources={"head_node": 1}')
        self.head = RayNode("head", self.base, head, self.environment)
        record = self.head.temp_dir / "ray_current_cluster"

        def address():
            self.head.check_running()
            return record.is_file() and record.read_text().strip()

        self.address = wait_for(address, 90, "the head's GCS")
        self.worker = self.start_worker("worker")
        ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        self.head_id = ray.get_runtime_context().get_node_id()
        self.worker_id = self.wait_for_worker()

    def start_worker(self, name: str) -> RayNode:
        worker = [f"--address={self.address}", '--resources={"worker_node": 1}']
        return RayNode(name, self.base, worker, self.environment)

    def wait_for_worker(self) -> str:
        """The id of the alive node with the ``worker_node`` resource."""
        import ray

        def worker_id():
            self.worker.check_running()
            alive = [node for node in ray.nodes() if node["Alive"]]
            ids = [node["NodeID"] for node in alive if "worker_node" in node["Resources"]]
            return ids[0] if ids else None

        return wait_for(worker_id, 90, "the worker node to join")

    def restart_worker(self, name: str) -> None:
        self.worker = self.start_worker(name)
        self.worker_id = self.wait_for_worker()

    def stop(self) -> None:
        import ray

        ray.shutdown()
        for node in (self.worker, self.head):
            if node is not None:
                node.stop()
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="module")
def two_nodes():
    # Ray's Unix sockets live under the temp dir: keep its path short
    nodes = TwoNodes(Path(tempfile.mkdtemp(prefix="rn-", dir="/tmp")))
    previous = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = nodes.address  # the driver joins this cluster
    yield nodes
    nodes.stop()
    if previous is None:
        os.environ.pop("RAY_ADDRESS", None)
    else:
        os.environ["RAY_ADDRESS"] = previous


@pytest.fixture(scope="module")
def warm_starts(tmp_path_factory):
    return tmp_path_factory.mktemp("warm_starts")


def overrides(run_dir: Path, warm_starts: Path, steps: int) -> list[str]:
    """The async recipe, shortened, with the engine and the environment on the worker node.
    Its warm start stops at its first check (the band is [0, 1]): this tests where things run
    and what crosses between nodes, not learning (test_tiny_run.py does)."""
    return [
        f"grpo.max_num_steps={steps}",
        "grpo.val_period=0",
        "grpo.val_at_start=false",
        "evaluation.enabled=false",
        "checkpointing.save_period=1",
        f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
        f"logger.log_dir={run_dir / 'logs'}",
        f"cpu_backend.warm_start_cache={warm_starts}",
        "cpu_backend.warm_start.target_low=0.0",
        "cpu_backend.warm_start.target_high=1.0",
        "cpu_backend.warm_start.check_every=1",
        "cpu_backend.warm_start.check_prompts=16",
        f"+cpu_backend.placement={{generation: {ON_WORKER}, environment: {ON_WORKER}}}",
    ]


def actor_nodes(class_name: str, job_id: str | None = None) -> set[str]:
    """The node ids Ray's actor table records for the actors of ``class_name``: those of job
    ``job_id`` (alive or dead), else the alive ones of any job. (An actor that restarts after
    its node died, as NeMo-RL's environment does, no longer names that node.)"""
    from ray._private import state

    return {
        actor["Address"]["NodeID"]
        for actor in state.actors().values()
        if actor.get("ActorClassName") == class_name
        and (actor["JobID"] == job_id if job_id else actor["State"] == "ALIVE")
    }


def start_driver(run_dir: Path, warm_starts: Path, steps: int) -> tuple[subprocess.Popen, Path]:
    """The recipe as a person runs it: another Ray driver of the same cluster (``RAY_ADDRESS``
    names it); its output in ``run_dir``'s parent."""
    log_path = run_dir.parent / f"{run_dir.name}.log"
    command = [
        sys.executable,
        str(ROOT / "examples" / "run_mmpo_math.py"),
        "--config",
        str(CONFIGS_DIR / ASYNC_RECIPE),
        *overrides(run_dir, warm_starts, steps),
    ]
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    return process, log_path


def stacks(pid: int) -> str:
    """Every thread's Python stack in process ``pid`` (py-spy, which NeMo-RL's environment has)."""
    py_spy = Path(sys.executable).with_name("py-spy")
    if not py_spy.is_file():
        return f"(no {py_spy} to read them)"
    result = subprocess.run(
        [str(py_spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60
    )
    return result.stdout + result.stderr


def latest_step(run_dir: Path) -> int:
    steps = [int(path.name.split("_")[1]) for path in (run_dir / "checkpoints").glob("step_*")]
    return max(steps, default=0)


def test_async_run_on_two_nodes_fails_clearly_when_the_worker_dies_and_resumes(
    two_nodes, warm_starts, tmp_path, monkeypatch
):
    """One run's life: it trains with the engine and the environment on the worker node and
    checkpoints; the worker node is killed mid-run; the run ends with an error naming the node
    and the checkpoint to resume from; on a restarted cluster the same command resumes there,
    refitting the new worker's engine from the head, and finishes."""
    import ray

    run_dir = tmp_path / "run"
    first_worker = two_nodes.worker_id
    process, log_path = start_driver(run_dir, warm_starts, 40)
    try:
        wait_for(lambda: process.poll() is not None or latest_step(run_dir) >= 1, 300, "step 1")
        assert process.poll() is None, log_path.read_text()[-3000:]
        # Ray's record of where the run's actors were placed: the worker node
        assert actor_nodes("GenerationWorker") == {first_worker}
        assert actor_nodes("MathEnvironment") == {first_worker}
        two_nodes.worker.kill()  # the worker node's machine dies mid-run
        killed_at = time.monotonic()
        try:
            process.wait(timeout=120)  # not a hang: the run ends within a bounded time
        except subprocess.TimeoutExpired:
            pytest.fail(
                "the run still waits 120 s after its worker node died; its stacks:\n"
                f"{stacks(process.pid)}\nits output:\n{log_path.read_text()[-4000:]}"
            )
    finally:
        if process.poll() is None:
            process.kill()
    output = log_path.read_text()
    assert process.returncode not in (0, None), output[-3000:]
    message = re.search(r"NodeDiedError: (.*)", output)
    assert message, output[-3000:]
    assert f"Ray node {first_worker[:12]}" in message.group(1)
    assert "resources worker_node" in message.group(1)
    saved = latest_step(run_dir)
    assert f"resumes from {run_dir / 'checkpoints' / f'step_{saved}'}" in message.group(1)
    print(f"the run ended {time.monotonic() - killed_at:.0f} s after its worker node died")

    # The same command on the cluster with a new worker node, in this process (the head's
    # driver), with the engine's refits recorded. One step more: a resumed async run of two
    # steps or more can wait forever on NeMo-RL v0.7.0 (NVIDIA-NeMo/RL#3066, fixed on main:
    # the driver warns), and the last step needs no trajectories beyond it.
    two_nodes.restart_worker("worker-2")
    engines = []
    shutdown = SeparateCPUGeneration.shutdown

    def recording_shutdown(self):  # NeMo-RL's trainer shuts the engine down first
        if self.worker is not None:
            engines.append({"weights": self.weights(), "refits": self.refit_count()})
        return shutdown(self)

    monkeypatch.setattr(SeparateCPUGeneration, "shutdown", recording_shutdown)
    policies = []
    init = CPUPolicy.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        policies.append(self)

    monkeypatch.setattr(CPUPolicy, "__init__", recording_init)
    console = Console()
    config = load(CONFIGS_DIR / ASYNC_RECIPE, overrides(run_dir, warm_starts, saved + 1)).config
    summary = driver.run(config, console=console)

    resumed_from = run_dir / "checkpoints" / f"step_{saved}"
    assert any(line.endswith(f"resuming from {resumed_from}") for line in console.lines)
    warned = any("lacks NVIDIA-NeMo/RL#3066" in line for line in console.lines)
    assert warned == async_resume_can_stall(Path(grpo.__file__).resolve().parents[2])
    steps = [line.split()[1] for line in console.lines if line.startswith("step ")]
    assert steps == [f"{saved + 1}/{saved + 1}"]
    assert Path(summary["checkpoint"]).parent.parent.name == f"step_{saved + 1}"
    # the policy trained here, on the head; the engine and environment ran on the new worker
    context = ray.get_runtime_context()
    assert context.get_node_id() == two_nodes.head_id
    assert actor_nodes("GenerationWorker", context.get_job_id()) == {two_nodes.worker_id}
    assert actor_nodes("MathEnvironment", context.get_job_id()) == {two_nodes.worker_id}
    # one refit before training and one after the step, each the policy's state_dict sent
    # from the head's object store to the worker's: the engine ends holding the policy's
    # final weights
    (engine,) = engines
    assert engine["refits"] == 2
    final = policies[-1].model.state_dict()
    assert all(torch.equal(engine["weights"][name], final[name]) for name in final)
