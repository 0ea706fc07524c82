"""Load, override, validate and explain a training config, with or without NeMo-RL.

Our recipes inherit NeMo-RL's configs with ``defaults: nemo_rl/<file>.yaml``, a path relative
to ``examples/configs`` where :func:`link_nemo_rl_configs` keeps a symbolic link
``nemo_rl -> <NeMo-RL checkout>/examples/configs``. NeMo-RL's own loader then resolves
them unchanged. Without NeMo-RL (``--dry-run`` on a laptop or in CI) :func:`load_run_config`
resolves ``defaults`` itself, skips a base it cannot find, and says so in the plan.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.nemo_rl.dmpo import read_dmpo_settings
from nemo_mmpo.nemo_rl.estimator import (
    NEMO_RL_BUILTIN_ESTIMATORS,
    is_our_estimator,
    read_estimator_settings,
)
from nemo_mmpo.nemo_rl.paper_settings import paper_setting_deviations

CONTAINER_NEMO_RL = Path("/opt/nemo-rl")
LINK_NAME = "nemo_rl"
#: this checkout's recipes (their ``defaults`` name ``nemo_rl/<file>.yaml``)
CONFIGS_DIR = Path(__file__).resolve().parents[2] / "examples" / "configs"
#: where the recipes' relative paths (data, prompts, logs) start: the entry point runs here
REPO_ROOT = CONFIGS_DIR.parents[1]


def find_nemo_rl_root() -> Path | None:
    """NeMo-RL checkout: ``$NEMO_RL_PATH``, the imported ``nemo_rl``, or the container's."""
    candidates = []
    if os.environ.get("NEMO_RL_PATH"):
        candidates.append(Path(os.environ["NEMO_RL_PATH"]))
    try:
        import nemo_rl

        candidates.append(Path(nemo_rl.__file__).resolve().parent.parent)
    except ImportError:
        pass
    candidates.append(CONTAINER_NEMO_RL)
    for candidate in candidates:
        if (candidate / "examples" / "configs").is_dir():
            return candidate.resolve()
    return None


def link_nemo_rl_configs(configs_dir: Path, nemo_rl_root: Path) -> Path:
    """Point ``configs_dir/nemo_rl`` at ``nemo_rl_root/examples/configs`` (idempotent)."""
    link = configs_dir / LINK_NAME
    target = (nemo_rl_root / "examples" / "configs").resolve()
    if link.is_symlink() and link.resolve() == target:
        return link
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        raise MMPOInputError(
            f"{link} exists and is not a link; remove it so nemo-mmpo can link NeMo-RL's configs"
        )
    link.symlink_to(target, target_is_directory=True)
    return link


@dataclass
class LoadedConfig:
    """A resolved config plus what the loader could not resolve."""

    config: dict[str, Any]
    unresolved_bases: list[str] = field(default_factory=list)
    loader: str = "nemo-mmpo"


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and value.get("_override_"):
            merged[key] = {k: v for k, v in value.items() if k != "_override_"}
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _load_with_defaults(path: Path, unresolved: list[str]) -> dict[str, Any]:
    config = yaml.safe_load(path.read_text()) or {}
    if not isinstance(config, dict):
        raise MMPOInputError(f"config {path} must be a mapping at the top level")
    defaults = config.pop("defaults", None)
    if defaults is None:
        return config
    base: dict[str, Any] = {}
    for default in [defaults] if isinstance(defaults, str) else list(defaults):
        parent = Path(default) if str(default).startswith("/") else path.parent / str(default)
        if not parent.exists():
            unresolved.append(str(parent))
            continue
        base = _merge(base, _load_with_defaults(parent, unresolved))
    return _merge(base, config)


def _parse_value(text: str) -> Any:
    return yaml.safe_load(text) if text != "" else ""


def apply_overrides(config: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Hydra-style ``a.b=value`` (key must exist), ``+a.b=value`` (add), ``~a.b`` (delete)."""
    for override in overrides:
        adding = override.startswith("+")
        deleting = override.startswith("~")
        body = override[1:] if adding or deleting else override
        key, separator, value = body.partition("=")
        if not key or (not separator and not deleting):
            raise MMPOInputError(f"override {override!r} is not of the form key.path=value")
        parts = key.split(".")
        node = config
        for depth, part in enumerate(parts[:-1]):
            if not isinstance(node.get(part), dict):
                if not adding:
                    raise MMPOInputError(
                        f"override {override!r}: {'.'.join(parts[: depth + 1])} is not in the "
                        f"config; use +{body} to add a new key"
                    )
                node[part] = {}
            node = node[part]
        leaf = parts[-1]
        if deleting:
            node.pop(leaf, None)
        elif leaf not in node and not adding:
            raise MMPOInputError(
                f"override {override!r}: {key} is not in the config; use +{body} to add it"
            )
        else:
            node[leaf] = _parse_value(value)
    return config


def _register_resolvers() -> None:
    """The arithmetic resolvers NeMo-RL's configs use (``${mul:a,b}``, ``${max:a,b}``)."""
    from omegaconf import OmegaConf

    with warnings.catch_warnings():  # omegaconf 2.4 deprecates the 2.3 API NeMo-RL uses
        warnings.simplefilter("ignore")
        for name, function in (
            ("mul", lambda a, b: a * b),
            ("div", lambda a, b: a / b),
            ("max", lambda a, b: max(a, b)),
        ):
            if not OmegaConf.has_resolver(name):
                OmegaConf.register_new_resolver(name, function)


def _resolve_interpolations(config: dict[str, Any]) -> dict[str, Any]:
    try:
        from omegaconf import OmegaConf
    except ImportError:
        return config
    _register_resolvers()
    try:
        return OmegaConf.to_container(OmegaConf.create(config), resolve=True)
    except Exception:  # unresolvable references to a missing base: keep them as text
        return config


def _import_nemo_rl_loader(required: bool) -> Any:
    """NeMo-RL's config module, None if NeMo-RL is absent (and not ``required``)."""
    try:
        from nemo_rl.utils import config as nemo_rl_config
    except ImportError:
        if required:
            raise
        return None
    except Exception as error:  # e.g. antlr4 4.13 breaking hydra-core 1.3
        raise MMPOInputError(
            f"NeMo-RL's config loader failed to import ({error!r}). NeMo-RL needs "
            "antlr4-python3-runtime 4.9.3 and omegaconf 2.3 (its uv.lock); reinstall them in "
            "NeMo-RL's environment"
        ) from None
    return nemo_rl_config


def _load_with_nemo_rl(nemo_rl_config: Any, path: Path, overrides: Sequence[str]) -> LoadedConfig:
    from omegaconf import OmegaConf

    register = getattr(nemo_rl_config, "register_omegaconf_resolvers", None)
    if register is not None:
        register()
    else:
        _register_resolvers()
    try:
        config = nemo_rl_config.load_config(str(path))
    except Exception as error:
        raise MMPOInputError(f"config {str(path)!r} failed to load: {error}") from None
    if overrides:
        try:
            config = nemo_rl_config.parse_hydra_overrides(config, list(overrides))
        except Exception as error:
            raise MMPOInputError(
                f"overrides {' '.join(overrides)!r} were refused: {error}. Use key=value for "
                "keys the config has and +key=value for new ones"
            ) from None
    try:
        resolved = OmegaConf.to_container(config, resolve=True)
    except Exception as error:
        raise MMPOInputError(f"config {str(path)!r} does not resolve: {error}") from None
    return LoadedConfig(resolved, [], loader="nemo_rl.utils.config")


def load_run_config(
    path: str | Path, overrides: Sequence[str] = (), use_nemo_rl: bool | None = None
) -> LoadedConfig:
    """Load ``path`` with its ``defaults`` chain and apply ``overrides``.

    Uses NeMo-RL's ``load_config``/``parse_hydra_overrides`` when NeMo-RL is importable
    (``use_nemo_rl`` None) or asked for, our own equivalent otherwise.
    """
    path = Path(path)
    if not path.is_file():
        raise MMPOInputError(f"config file {str(path)!r} does not exist or is not a file")
    nemo_rl_root = find_nemo_rl_root()
    if nemo_rl_root is not None and path.resolve().parent == CONFIGS_DIR.resolve():
        link_nemo_rl_configs(CONFIGS_DIR, nemo_rl_root)
    if use_nemo_rl is not False:
        nemo_rl_config = _import_nemo_rl_loader(required=bool(use_nemo_rl))
        if nemo_rl_config is not None:
            return _load_with_nemo_rl(nemo_rl_config, path, overrides)
    unresolved: list[str] = []
    config = _load_with_defaults(path, unresolved)
    config = apply_overrides(config, overrides)
    return LoadedConfig(_resolve_interpolations(config), unresolved)


def _get(config: dict[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


LOSS_NAMES = ("mmpo", "dmpo", "clipped_pg")


def _validate_estimator(config: dict[str, Any], group_size: int, warnings: list[str]) -> None:
    estimator_config = _get(config, "grpo.adv_estimator", {}) or {}
    name = estimator_config.get("name")
    if name is None:
        raise MMPOInputError("grpo.adv_estimator.name is missing")
    if name in NEMO_RL_BUILTIN_ESTIMATORS:
        return  # NeMo-RL's own estimator: NeMo-RL validates it
    settings = read_estimator_settings(estimator_config)  # unknown names: both lists named
    if settings.estimator == "unbiased":
        order = settings.objective.truncation_order
        if group_size < 2 or order > group_size:
            raise MMPOInputError(
                f"grpo.adv_estimator.estimator=unbiased with truncation_order={order} and "
                f"grpo.num_generations_per_prompt={group_size}: the unbiased estimator needs "
                "2 <= G and T <= G. Raise num_generations_per_prompt, lower truncation_order, "
                "or use estimator=plugin"
            )
    k = settings.options.get("k")
    if k is not None and k > group_size:
        raise MMPOInputError(
            f"grpo.adv_estimator.k={k} exceeds grpo.num_generations_per_prompt={group_size}; "
            "pass@k needs k <= G"
        )
    scaling = bool(_get(config, "grpo.reward_scaling.enabled", False))
    shaping = bool(_get(config, "grpo.reward_shaping.enabled", False))
    if (scaling or shaping) and settings.reward_threshold is None:
        raise MMPOInputError(
            "grpo.reward_scaling.enabled or grpo.reward_shaping.enabled is true, so rewards "
            "will not be 0/1, but MMPO needs binary rewards. Set both to false or set "
            "grpo.adv_estimator.reward_threshold"
        )
    clip_high = _get(config, "grpo.advantage_clip_high")
    if clip_high is not None and settings.objective.name.startswith("mmpo"):
        weight_max = sum(settings.objective.weight_coefficients())
        warnings.append(
            f"grpo.advantage_clip_high={clip_high} clips MMPO advantages, whose weight "
            f"reaches {weight_max:g} at f = 1"
        )


def _validate_loss(config: dict[str, Any], rollouts: int, warnings: list[str]) -> None:
    loss_config = _get(config, "loss_fn", {}) or {}
    loss_name = loss_config.get("name")
    if loss_name not in (None, *LOSS_NAMES):
        raise MMPOInputError(
            f"loss_fn.name={loss_name!r}: use 'mmpo' (NeMo-RL's clipped surrogate, reporting "
            "non-paper settings), 'dmpo' (the surrogate plus DMPO's penalty) or 'clipped_pg' "
            "(NeMo-RL's ClippedPGLossFn as configured)"
        )
    if loss_name == "dmpo":
        _validate_dmpo(config, loss_config, rollouts, warnings)
    if loss_name == "mmpo":
        warnings.extend(
            f"{deviation}: loss_fn.name=mmpo computes NeMo-RL's loss with this value"
            for deviation in paper_setting_deviations(loss_config)
        )
    if _get(config, "grpo.async_grpo.enabled", False) and not loss_config.get(
        "use_importance_sampling_correction", False
    ):
        raise MMPOInputError(
            "grpo.async_grpo.enabled=true needs loss_fn.use_importance_sampling_correction=true "
            "(NeMo-RL's async trainer asserts it: rollouts come from an older policy)"
        )
    global_batch = _get(config, "policy.train_global_batch_size")
    if loss_config.get("force_on_policy_ratio") and global_batch != rollouts:
        raise MMPOInputError(
            f"loss_fn.force_on_policy_ratio=true needs policy.train_global_batch_size="
            f"{rollouts} (one optimizer step per rollout batch), not {global_batch}"
        )
    kl = loss_config.get("reference_policy_kl_penalty") or 0
    if kl == 0 and _get(config, "grpo.skip_reference_policy_logprobs_calculation") is False:
        warnings.append(
            "loss_fn.reference_policy_kl_penalty=0 but "
            "grpo.skip_reference_policy_logprobs_calculation=false: the reference log-probs "
            "are computed every step and unused"
        )


def _validate_dmpo(
    config: dict[str, Any], loss_config: dict[str, Any], rollouts: int, warnings: list[str]
) -> None:
    settings = read_dmpo_settings(loss_config)
    warnings.extend(
        f"{deviation}: loss_fn.name=dmpo trains with this value"
        for deviation in paper_setting_deviations(loss_config) + settings.deviations()
    )
    if loss_config.get("force_on_policy_ratio"):
        raise MMPOInputError(
            "loss_fn.name=dmpo needs the log-probabilities NeMo-RL computes before training "
            "(prev_logprobs), which loss_fn.force_on_policy_ratio=true skips: set "
            "loss_fn.force_on_policy_ratio=false"
        )
    if _get(config, "data_plane.enabled", False):
        raise MMPOInputError(
            "loss_fn.name=dmpo runs in NeMo-RL's grpo_train and async_grpo_train; "
            "data_plane.enabled=true selects grpo_train_sync, which nemo-mmpo cannot reach "
            "with DMPO's batch terms: set data_plane.enabled=false"
        )
    global_batch = _get(config, "policy.train_global_batch_size")
    if isinstance(global_batch, int) and 0 < global_batch < rollouts:
        warnings.append(
            f"policy.train_global_batch_size={global_batch} < {rollouts} rollouts: "
            f"{rollouts // global_batch} optimizer steps per batch; DMPO's penalty is exact at "
            "the first and first-order (linearised at the batch's start) at the others"
        )
    if _get(config, "grpo.adv_estimator.name") != "grpo":
        warnings.append(
            f"grpo.adv_estimator.name={_get(config, 'grpo.adv_estimator.name')!r}: DMPO's "
            "target is the softmax of these advantages; the paper's DMPO uses GRPO's"
        )


def _training_prompts(config: dict[str, Any]) -> tuple[int, str] | None:
    """How many prompts ``data.train.data_path`` holds: counted when the file exists, else the
    MATH train size for the file ``--prepare-data`` writes; None when neither is known."""
    data_path = _get(config, "data.train.data_path")
    if not isinstance(data_path, str):
        return None
    path = Path(data_path) if Path(data_path).is_absolute() else REPO_ROOT / data_path
    if path.is_file():
        with path.open(encoding="utf-8") as handle:
            return sum(1 for line in handle if line.strip()), data_path
    if path.name == "math_train.jsonl":
        from nemo_mmpo.data import BENCHMARKS

        size = BENCHMARKS["math_train"].expected_size
        return size, f"{data_path} (MATH train as --prepare-data writes it)"
    return None


def async_batches_needed(max_num_steps: int) -> int:
    """Dataloader batches NeMo-RL's async trainer needs for ``max_num_steps`` steps.

    It reads the training dataloader once (``grpo.max_num_epochs`` does not apply), and its
    trajectory collector needs one batch beyond the last step: when the dataloader ends it
    stops and drops the generation in flight. Short of that, v0.7.0 waits forever for the last
    step's trajectories and main stops with an error.
    """
    return max_num_steps + 1


def _validate_async_data(config: dict[str, Any], prompts: int) -> None:
    """Refuse an async run that the training set cannot feed (:func:`async_batches_needed`)."""
    if not _get(config, "grpo.async_grpo.enabled", False):
        return
    if (_get(config, "cpu_backend", {}) or {}).get("enabled"):
        return  # the tiny CPU driver lays the epochs the run needs into one pass
    known = _training_prompts(config)
    max_steps = _get(config, "grpo.max_num_steps")
    if known is None or not isinstance(max_steps, int):
        return
    size, source = known
    batches = size // prompts
    if async_batches_needed(max_steps) > batches:
        raise MMPOInputError(
            f"grpo.max_num_steps={max_steps} with grpo.async_grpo.enabled=true: NeMo-RL's "
            f"async trainer reads the training set once (grpo.max_num_epochs does not apply) "
            f"and needs one batch beyond the last step (at the dataloader's end its collector "
            f"stops and drops the generation in flight); {source} holds {size} prompts = "
            f"{batches} batches of {prompts}, so at step {min(max_steps, batches)} NeMo-RL "
            f"v0.7.0 waits forever (main stops with an error). Set "
            f"grpo.max_num_steps={max(batches - 1, 0)} or fewer"
        )


def validate_run_config(config: dict[str, Any]) -> list[str]:
    """Check the settings MMPO depends on; returns warnings, raises on errors."""
    warnings: list[str] = []
    prompts = _get(config, "grpo.num_prompts_per_step")
    group_size = _get(config, "grpo.num_generations_per_prompt")
    for key, value in (
        ("num_prompts_per_step", prompts),
        ("num_generations_per_prompt", group_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise MMPOInputError(f"grpo.{key}={value!r}: give an integer >= 1")
    _validate_estimator(config, group_size, warnings)
    global_batch = _get(config, "policy.train_global_batch_size")
    rollouts = prompts * group_size
    if isinstance(global_batch, int) and global_batch > 0 and rollouts % global_batch:
        raise MMPOInputError(
            f"policy.train_global_batch_size={global_batch} must divide the rollouts per step "
            f"(num_prompts_per_step x num_generations_per_prompt = {rollouts})"
        )
    _validate_loss(config, rollouts, warnings)
    _validate_async_data(config, prompts)
    return warnings


def run_plan(loaded: LoadedConfig) -> str:
    """Human-readable plan: GPUs, parallel layout, batch arithmetic, objective."""
    config = loaded.config
    nodes = _get(config, "cluster.num_nodes", 1)
    gpus_per_node = _get(config, "cluster.gpus_per_node", 1)
    gpus = nodes * gpus_per_node
    megatron = bool(_get(config, "policy.megatron_cfg.enabled", False))
    if megatron:
        tensor = _get(config, "policy.megatron_cfg.tensor_model_parallel_size", 1)
        pipeline = _get(config, "policy.megatron_cfg.pipeline_model_parallel_size", 1)
        context = _get(config, "policy.megatron_cfg.context_parallel_size", 1)
        backend = "Megatron"
    else:
        tensor = _get(config, "policy.dtensor_cfg.tensor_parallel_size", 1)
        pipeline = 1
        context = _get(config, "policy.dtensor_cfg.context_parallel_size", 1)
        backend = "DTensor"
    colocated = _get(config, "policy.generation.colocated.enabled", True)
    generation_gpus = 0
    if not colocated:
        resources = _get(config, "policy.generation.colocated.resources", {}) or {}
        generation_gpus = (resources.get("num_nodes") or 1) * (resources.get("gpus_per_node") or 0)
    training_gpus = gpus - generation_gpus
    model_parallel = tensor * pipeline * context
    data_parallel = (
        training_gpus // model_parallel
        if training_gpus > 0 and training_gpus % model_parallel == 0
        else None
    )
    prompts = _get(config, "grpo.num_prompts_per_step")
    group_size = _get(config, "grpo.num_generations_per_prompt")
    rollouts = prompts * group_size
    global_batch = _get(config, "policy.train_global_batch_size")
    micro_batch = _get(config, "policy.train_micro_batch_size")
    vllm_tp = _get(config, "policy.generation.vllm_cfg.tensor_parallel_size", 1)
    placement = (
        "colocated with training"
        if colocated
        else f"on separate GPUs ({generation_gpus} for generation, {training_gpus} for training)"
    )
    asynchronous = _get(config, "grpo.async_grpo.enabled", False)
    mode = "asynchronous GRPO" if asynchronous else "GRPO"
    estimator = _get(config, "grpo.adv_estimator", {}) or {}
    lines = [
        f"config loader: {loaded.loader}",
        f"model: {_get(config, 'policy.model_name')}",
        f"cluster: {nodes} node(s) x {gpus_per_node} GPU(s) = {gpus} GPU(s)",
        f"training: {mode}, {backend}, tensor {tensor} x pipeline {pipeline} x context {context}"
        f" -> data parallel {data_parallel if data_parallel else 'INVALID (does not divide GPUs)'}",
        f"generation: {_get(config, 'policy.generation.backend', 'vllm')}, tensor parallel "
        f"{vllm_tp}, {placement}",
        f"rollouts/step: {prompts} prompts x {group_size} generations = {rollouts}",
    ]
    cpu = _get(config, "cpu_backend", {}) or {}
    if cpu.get("enabled"):
        data_parallel = 1
        trainer = "async_grpo_train" if asynchronous else "grpo_train"
        generation = (
            "its own copy of the weights in a CPU Ray actor, refit after every optimizer step"
            if asynchronous
            else "the policy's weights"
        )
        lines[2:5] = [
            "cluster: this machine's CPUs (no GPU)",
            f"training: {mode} in NeMo-RL's {trainer}, nemo-mmpo CPU policy (driver process):"
            f" tiny Llama, hidden {cpu.get('hidden_size')} x {cpu.get('num_layers')} layers, "
            f"AdamW lr {cpu.get('learning_rate')}, warm start {cpu.get('warm_start_steps')} "
            "steps",
            f"generation: transformers sampling on {generation} (nemo-mmpo CPU backend)",
        ]
    if isinstance(global_batch, int) and global_batch:
        steps = rollouts // global_batch
        accumulation = (
            global_batch // (micro_batch * data_parallel) if data_parallel and micro_batch else "?"
        )
        lines.append(
            f"optimizer: {steps} step(s) per rollout batch of {global_batch} sequences "
            f"(micro batch {micro_batch}, gradient accumulation {accumulation})"
        )
    lines.append(
        f"sequence: max total {_get(config, 'policy.max_total_sequence_length')} tokens, "
        f"max new {_get(config, 'policy.generation.max_new_tokens')}; temperature "
        f"{_get(config, 'policy.generation.temperature')}, top-p "
        f"{_get(config, 'policy.generation.top_p')}"
    )
    if is_our_estimator(estimator.get("name")):
        settings = read_estimator_settings(estimator)
        lines.append(f"advantage: nemo-mmpo {settings.describe()}")
    else:
        lines.append(f"advantage: NeMo-RL built-in {estimator.get('name')!r}")
    lines.append(
        f"loss: {_get(config, 'loss_fn.name', 'clipped_pg')}, clip "
        f"[{_get(config, 'loss_fn.ratio_clip_min')}, {_get(config, 'loss_fn.ratio_clip_max')}],"
        f" KL {_get(config, 'loss_fn.reference_policy_kl_penalty')}"
    )
    if _get(config, "loss_fn.name") == "dmpo":
        settings = read_dmpo_settings(_get(config, "loss_fn", {}))
        mode = "zero-signal groups left out" if settings.filter_zero_signal else "all groups"
        lines.append(
            f"  + DMPO penalty: weight {settings.weight:g}, temperature "
            f"{settings.temperature:.6g}, {mode}"
        )
    lines.append(
        f"validation: every {_get(config, 'grpo.val_period')} steps; checkpoints: "
        f"{_get(config, 'checkpointing.checkpoint_dir')}"
    )
    for base in loaded.unresolved_bases:
        lines.append(
            f"NOTE: base config {base} was not found (no NeMo-RL checkout); only this "
            "project's keys were validated. Set NEMO_RL_PATH to resolve it"
        )
    return "\n".join(lines)
