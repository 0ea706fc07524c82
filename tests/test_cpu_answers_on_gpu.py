"""The CPU rig's answers never reach a GPU run: refused where torch sees a CUDA device unless the
rig asks for them (``NEMO_MMPO_CPU_ANSWERS=1``, which its Ray workers get), and the watcher
chooses them by ``cpu_backend.enabled``, not by the section being there. CUDA is simulated
(``torch.cuda.is_available`` patched); nothing here installs an answer into this process."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from nemo_mmpo.cpu.answers import import_hooks, megatron_shims, vllm_shims
from nemo_mmpo.cpu.answers.import_hooks import CPU_ANSWERS_ENV
from nemo_mmpo.cpu.engines import ray_cluster
from nemo_mmpo.eval.convert import is_cpu_rig_recipe

INSTALLERS = {
    "vllm_shims.install_on_import": vllm_shims.install_on_import,
    "megatron_shims.install_on_import": megatron_shims.install_on_import,
    "megatron_shims.answer_torch": megatron_shims.answer_torch,
}


@pytest.fixture
def finders(monkeypatch):
    """``sys.meta_path`` for the test (restored afterwards)."""
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    return sys.meta_path


@pytest.mark.parametrize("installer", INSTALLERS, ids=list(INSTALLERS))
def test_every_answer_refuses_a_process_that_sees_cuda(monkeypatch, finders, installer):
    monkeypatch.delenv(CPU_ANSWERS_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    before = list(finders)
    with pytest.raises(
        RuntimeError, match=rf"sees a CUDA device: nothing was installed.*{CPU_ANSWERS_ENV}=1"
    ):
        INSTALLERS[installer]()
    assert finders == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("installer", INSTALLERS, ids=list(INSTALLERS))
def test_on_a_real_cuda_device_every_answer_refuses(monkeypatch, finders, installer):
    """The same refusal where the CUDA device is real (the GPU check runs ``-k cuda``)."""
    monkeypatch.delenv(CPU_ANSWERS_ENV, raising=False)
    before = list(finders)
    with pytest.raises(RuntimeError, match="sees a CUDA device: nothing was installed"):
        INSTALLERS[installer]()
    assert finders == before


def test_the_rig_asks_explicitly_and_a_cpu_needs_no_asking(monkeypatch, finders):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(CPU_ANSWERS_ENV, "1")
    vllm_shims.install_on_import()
    assert any(isinstance(finder, import_hooks.ShimOnImport) for finder in finders)
    monkeypatch.delenv(CPU_ANSWERS_ENV)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    import_hooks.refuse_on_cuda("the answers")  # no CUDA device: installs, without asking


def test_the_rigs_ray_workers_get_the_explicit_ask(monkeypatch):
    started = {}
    fake_ray = types.SimpleNamespace(
        is_initialized=lambda: False,
        init=lambda **options: started.update(options),
        get_runtime_context=lambda: types.SimpleNamespace(gcs_address="127.0.0.1:1"),
    )
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    monkeypatch.setattr(ray_cluster, "running_cluster_address", lambda: "127.0.0.1:1")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray_cluster.start_ray(vllm_shims.SETUP_HOOK)
    assert started["runtime_env"] == {
        "worker_process_setup_hook": vllm_shims.SETUP_HOOK,
        "env_vars": {CPU_ANSWERS_ENV: "1"},
    }


@pytest.mark.parametrize(
    ("config", "cpu_rig"),
    [
        ({"cpu_backend": {"enabled": True}}, True),
        ({"cpu_backend": {"enabled": False, "workers": 2}}, False),  # a GPU recipe
        ({"cpu_backend": None}, False),
        ({}, False),
    ],
)
def test_the_watcher_applies_the_answers_only_to_the_rigs_recipes(config, cpu_rig):
    assert is_cpu_rig_recipe(config) is cpu_rig
