"""The tiny run learns, on any machine: 50 of the recipe's GRPO steps raise the policy's
expected success on the training problems by more than the margin the spread over seeds and
numerics gives (``tests/learning_check.py``). The vLLM recipe's check:
``tests/cpu/test_tiny_run_vllm.py``.
"""

from __future__ import annotations

import pytest
from learning_check import check_fifty_steps_learn
from nemo_rl_support import import_nemo_rl

# CI time: CI's learning check is the Megatron recipe's (tests/cpu/test_tiny_run_megatron.py),
# the path a GPU run takes, at this check's margin; this one on request (NEMO_MMPO_BEYOND_CI=1)
pytestmark = [pytest.mark.nemo_rl, pytest.mark.one_snapshot, pytest.mark.beyond_ci]
import_nemo_rl("nemo_rl.algorithms.grpo")


def test_fifty_steps_raise_the_expected_success_of_the_training_problems(
    ray_cluster, tmp_path, tiny_warm_starts
):
    check_fifty_steps_learn("mmpo_tiny_cpu.yaml", tmp_path, tiny_warm_starts)
