"""The tiny Hugging Face Llama as a real megatron-core ``GPTModel`` (``nemo_mmpo.cpu.
megatron_llama``), the first piece of a policy that trains through megatron-core.

What holds by construction: the converted ``GPTModel`` computes the Llama's function, so its
logits equal the Llama's on the same tokens, one process or split over two tensor-parallel
gloo ranks (float32, other kernels and summation orders: measured 3.3e-7 and 4.2e-7 on
logits of spread 0.24, bound 1e-4); the conversion is a re-layout, so Megatron -> Hugging Face
gives back every tensor bit for bit, also from the two ranks' shards. The layouts themselves,
without megatron-core: ``tests/test_megatron_llama_layout.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from nemo_rl_support import import_nemo_rl

pytestmark = pytest.mark.nemo_rl
import_nemo_rl("megatron.core")  # scripts/nemo_rl_requirements.txt pins megatron-core

TESTS = Path(__file__).resolve().parents[1]
#: float32 logits of magnitude ~1 through two layers, other kernels and summation order
LOGIT_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("megatron_llama")
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join([str(TESTS), environment.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-c", "from megatron_llama_ranks import main; main()", str(out)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-8000:]
    return {name: torch.load(out / f"{name}.pt") for name in ("hf", "tp1", "tp2")}


@pytest.mark.parametrize("layout", ["tp1", "tp2"])
def test_the_gpt_model_computes_the_llamas_logits(converted, layout):
    hf, megatron = converted["hf"], converted[layout]
    mask = torch.arange(hf["input_ids"].shape[1])[None] < hf["lengths"][:, None]
    gap = (megatron["logits"] - hf["logits"]).abs()[mask].max()
    assert gap < LOGIT_TOLERANCE, f"{layout}: largest logit difference {gap:.2e}"
    assert hf["logits"][mask].std() > 100 * LOGIT_TOLERANCE  # not a vacuous comparison


@pytest.mark.parametrize("layout", ["tp1", "tp2"])
def test_megatron_weights_convert_back_bit_for_bit(converted, layout):
    original = converted["hf"]["weights"]
    back = converted[layout]["round_trip"]
    assert sorted(back) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(back[name], tensor), name
