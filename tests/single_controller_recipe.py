"""The paper's recipe as a single-controller run, for the tests that need one recipe text
(``tests/launch/test_single_controller.py``,
``tests/nemo_rl_adapter/test_next_estimator_api.py``):
``{base}`` is the paper recipe's path."""

#: the paper's recipe as a single-controller run (NeMo-RL's own single-controller recipe,
#: grpo_math_1B_megatron_single_controller.yaml, sets the same)
SINGLE_CONTROLLER_RECIPE = """\
defaults:
  - {base}

grpo:
  async_grpo: null
  val_period: 0
  val_at_start: false
  val_at_end: false

async_rl:
  sampler:
    name: in_order
    max_lookahead_versions: 0
  min_groups_for_streaming_train: 16
  max_inflight_prompts: 16

data_plane:
  enabled: true

checkpointing:
  metric_name: null

policy:
  generation:
    vllm_cfg:
      async_engine: true
"""
