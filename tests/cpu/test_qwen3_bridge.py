"""The CPU rig's tiny Qwen3 (``cpu_backend.model.architecture: qwen3``) round-trips through
Megatron-Bridge's Qwen3 bridge on the CPU, as NeMo-RL's Megatron worker imports it.

``tests/cpu/qwen3_bridge_check.py`` runs in a fresh interpreter (the worker's CPU answers
change torch for the whole process): the Hugging Face folder imported by
``AutoBridge.to_megatron_provider(load_weights=True)`` into the local layer spec the CPU rig
builds (q/k layernorm: megatron-core's local RMSNorm, ``WrappedTorchNorm``), a forward equal
to ``transformers``' (float32 rounding), and ``export_hf_weights`` (the refit's and the
converter's direction) giving back the same weights under the Hugging Face names, the tied
``lm_head`` once (as the embedding). The whole recipe with the tiny Qwen3 (Megatron/vLLM
log-prob ratio 1, resume, the watcher's conversion) is the container layout's part,
``tests/container/test_container_layout.py`` (v0.7.0's engines, in CI); this, on main's
(Megatron-Bridge 8c46dc42, megatron-core 0.20.0; v0.7.0's pass it too), costs ~25 CPU-seconds
(the fresh interpreter's imports), so it runs on request (``NEMO_MMPO_BEYOND_CI=1``): CI's
time is spent to the last minute.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import patience
import pytest
from nemo_rl_support import import_nemo_rl

pytestmark = [pytest.mark.nemo_rl, pytest.mark.main_snapshot, pytest.mark.beyond_ci]
import_nemo_rl("megatron.core")
if importlib.util.find_spec("megatron.bridge") is None:
    import_nemo_rl("megatron.bridge")  # skips, or fails under CI, naming what is missing

from nemo_mmpo.cpu.rig.model import ModelShape, char_tokenizer, tiny_model

CHECK = Path(__file__).with_name("qwen3_bridge_check.py")
ROOT = Path(__file__).resolve().parents[2]


def test_the_tiny_qwen3_round_trips_through_megatron_bridges_qwen3_bridge(tmp_path):
    tokenizer = char_tokenizer()
    model = tiny_model(tokenizer, ModelShape(architecture="qwen3"), seed=3)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    config = model.config
    assert config.num_key_value_heads < config.num_attention_heads  # grouped-query attention
    assert config.tie_word_embeddings and config.head_dim == 128 // 4
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = tmp_path / "report.json"
    environment = dict(os.environ, TORCHDYNAMO_DISABLE="1", HF_HUB_OFFLINE="1")
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, str(CHECK), str(folder), str(out)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=patience.COMMAND_S,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    report = json.loads(out.read_text())
    assert report["bridge"] == "Qwen3Bridge", report
    assert report["layer_spec"] and report["qk_layernorm"], report
    assert report["q_layernorm"] == report["k_layernorm"] == "RMSNorm", report
    assert (report["query_groups"], report["heads"]) == (2, 4), report
    assert report["tied"] and report["rotary_base"] == 1e6, report
    assert report["logits_relative"] < 1e-5, report
    assert report["exported_only"] == [] and report["hugging_face_only"] == ["lm_head.weight"]
    assert report["largest_weight_difference"] == 0.0, report
