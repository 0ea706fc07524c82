"""The rule that NeMo-RL's own ``MasterConfig`` accepts the config."""

from __future__ import annotations

from typing import Any

from nemo_mmpo.launch.rules.registry import Findings, rule


@rule
def nemo_rl_master_config(config: dict[str, Any], findings: Findings) -> None:
    """Where NeMo-RL's trainer imports (its own environment), the config builds its
    ``MasterConfig`` as ``run_grpo.py`` will build it: its types and required keys."""
    import importlib.util

    if importlib.util.find_spec("nemo_rl") is None:
        return  # a login node: NeMo-RL's loader has read the config, its types are not here
    try:
        from nemo_rl.algorithms.grpo import MasterConfig
    except Exception:
        return  # NeMo-RL's trainer does not import here (no GPU libraries): types unchecked
    from pydantic import ValidationError

    nemo_rl_sections = {key: item for key, item in config.items() if key != "cpu_backend"}
    try:
        MasterConfig(**nemo_rl_sections)
    except ValidationError as error:
        for item in error.errors()[:5]:
            key = ".".join(str(part) for part in item["loc"])
            findings.errors.append(
                f"{key}={item.get('input')!r}: NeMo-RL's MasterConfig refuses it ({item['msg']})"
            )
