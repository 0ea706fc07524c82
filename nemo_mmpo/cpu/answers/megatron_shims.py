"""CPU answers for NeMo-RL's own Megatron policy worker (``MegatronPolicyWorker``) over gloo:
under NeMo-RL main (7ea279ab) with megatron-core 0.20.0 (built from Megatron-LM 14346b65, its
pin) and Megatron-Bridge 8c46dc42 (its pinned source), under NeMo-RL v0.7.0 with PyPI's
megatron-core 0.19.2 and Megatron-Bridge 0.6.2. NeMo-RL's, Megatron-Bridge's and
megatron-core's files stay untouched; each answer below names the line it answers (measured in
``/work/shared/notes/megatron-policy-worker-on-cpu.md``) and changes no number. A bare
``file.py:N`` is the same line in both: NeMo-RL v0.7.0 and main, Megatron-Bridge 0.6.2 and
8c46dc42, megatron-core 0.19.2 and 0.20.0; where they differ, the first is v0.7.0's (NeMo-RL
v0.7.0, Megatron-Bridge 0.6.2, megatron-core 0.19.2) and main's follows, marked ``main``
(NeMo-RL main), ``8c46dc42`` (Megatron-Bridge) or ``0.20.0`` (megatron-core).

They are applied only by the CPU rig and the tests: Ray's ``worker_process_setup_hook``
(:data:`SETUP_HOOK`, :func:`install_on_import`) installs import hooks in every worker process;
the torch-level answers (:func:`answer_torch`) are applied when NeMo-RL's Megatron worker module
(or its checkpoint converter) is imported there, so the vLLM engine and the math environment
never see them. On a GPU node none of this is installed.

Import-time (before any CUDA question):

- Megatron-Bridge ``peft/lora_layers.py:20``: its one unguarded ``import
  transformer_engine.pytorch`` (reached from ``models/conversion/peft_bridge.py:41``, through
  ``peft/canonical_lora.py:26``; 8c46dc42 also directly, ``peft_bridge.py:42``). The
  module executes with a stand-in ``transformer_engine`` whose classes match nothing, removed
  again afterwards, so Megatron-Bridge's guarded imports still see Transformer Engine absent.

torch (:func:`answer_torch`):

- ``init_process_group("nccl")`` (``models/megatron/setup.py:215``, main ``:321``;
  Megatron-Bridge ``model_provider.py:256, 321``) and ``new_group(backend="nccl")`` (worker
  :211, main :381): gloo.
- ``torch.cuda.set_device`` (worker :266, main :441; ``model_provider.py:255, 320``): nothing to
  set; ``torch.cuda.current_device()`` is device 0 (worker :292, main :469, asserts it equals
  ``ray.get_gpu_ids()[0]``, which answers ``[0]`` on a CPU actor, worker :263, main :438), and
  tensors asked for on it stay on the CPU (megatron-core's ``device=torch.cuda.current_device()``);
  ``get_device_name`` (worker :818, main :1067 and :1769, the training metrics) is ``cpu``; the
  memory counters (``offload_before_refit``, :1491, main :3084) are 0.
- tensor factories with ``device="cuda"``, ``.cuda()``, ``.to("cuda")``, ``pin_memory`` keep
  tensors on the CPU (megatron-core ``schedules.py:749, 2292`` (0.20.0: ``:758, 2301``),
  ``clip_grads.py:96``, ``exchange_utils.py:97-109, 329`` (0.20.0: ``:99-111, 331``); NeMo-RL
  ``data.py:116, 657`` (main ``:127, 815``), ``train.py:757`` (main ``:855``),
  ``model_utils.py:1364-1365`` (main ``:1370-1371``), ``setup.py:1170`` (main ``:1666``), worker
  :563 (main :787)). Module-level wrappers, not a ``TorchFunctionMode``: NeMo-RL calls
  ``.cuda()`` inside autograd's backward, where a mode is off.
- CUDA streams and synchronisation (megatron-core ``param_and_grad_buffer.py:632``, 0.20.0
  ``:638``; ``megatron/training/models/dist_utils.py:302-305``, which Megatron-Bridge imports,
  ``models/common/unimodal.py:15``: a package of PyPI's megatron-core 0.19.2 wheel, and under
  main too, since the 14346b65 build has ``megatron/core`` only): streams that wait for nothing.
- ``torch.cuda.get_rng_state`` / ``set_rng_state`` (Megatron-Bridge
  ``training/checkpointing.py:491`` on every save, ``:3155, :3167`` on load; 8c46dc42: ``:506``,
  ``:3199, :3211``): there is no CUDA generator; an empty state is saved and restoring it does
  nothing.

megatron-core and Megatron-Bridge:

- the model-parallel RNG tracker (``tensor_parallel/random.py:303``) on the CPU generator;
  Megatron-Bridge ``training/initialize.py:869`` (8c46dc42: ``:866``) seeds it only when a CUDA
  device exists (the first layer's init then fails, ``random.py:316``): while
  ``_set_random_seed`` runs, the CPU counts as one device, so its own seeding runs unchanged.
- ``initialize_megatron`` asserts CUDA (``initialize.py:91``; NeMo-RL ``setup.py:1153``, main
  ``:1649``, calls it without ``allow_no_cuda``) and refuses parallel groups on no CUDA device
  with the nccl backend (``:762-763``; 8c46dc42: ``:759-760``): it runs with
  ``allow_no_cuda=True`` and the gloo backend.
- ``AutoBridge.to_megatron_provider`` (``auto_bridge.py:1638``; 8c46dc42: ``:1906``, deprecated
  there with a ``FutureWarning``, ``model_bridge.py:759-767``) gives Transformer Engine's layer
  spec (``gpt_provider.py:120``) and TE fusions (``llama_bridge.py:67-71``; 8c46dc42:
  ``:57-60``, through ``hf_config_to_provider_kwargs``, ``:77-79``): the local spec with a
  plain-torch core attention (:func:`~nemo_mmpo.cpu.answers.megatron_attention.cpu_layer_spec`)
  and those fusions off; NeMo-RL's import (``community_import.py:112``, main ``:133``) writes it
  into ``run_config.yaml``, so training builds the same model (main also calls it for a
  ``megatron_lm`` checkpoint, ``setup.py:609``).
- asynchronous checkpoint saves (NeMo-RL main's recipes; the ``nvrx`` strategy,
  Megatron-Bridge ``training/config.py:521``, needs ``nvidia-resiliency-ext``, a CUDA package):
  NeMo-RL's checkpoint config (``setup.py:907``; main ``:1250``) saves synchronously (v0.7.0's
  already does, ``:920``; main passes the recipe's ``async_save`` through, ``:1289-1298``).
- ``compile_helpers()`` (``initialize.py:147``; megatron-core ``datasets/utils.py:20-30``) runs
  ``make`` in ``megatron/core/datasets``; PyPI's 0.19.2 wheel and main's 0.20.0 build (pip from
  the 14346b65 source, whose ``datasets/Makefile`` it does not install) both hold the built
  helper (``helpers_cpp``) and no Makefile: nothing to build.
- a checkpoint loaded into a fresh distributed optimizer over torch's Adam (TE's and Apex's
  need a GPU) stops at ``distrib_optimizer.py:839`` (0.19.2 and 0.20.0 alike: no state yet):
  megatron-core's own dummy state first (``_init_optimizer_states_with_dummy_values``),
  replaced by the loaded values.
- after that load every parameter's torch Adam state shares one ``step`` tensor
  (``distrib_optimizer.py:1028-1032``, 0.19.2 and 0.20.0 alike) holding the pre-load step (the
  ``dp_reshardable`` template's, copied back, ``:1953-1957`` into ``:1219-1225``), which the
  next step advances once per parameter (torch 2.11.0 ``adam.py:414``): each parameter gets its
  own tensor with the loaded param groups' step, so a resumed step is the uninterrupted run's
  (Transformer Engine's ``FusedAdam``, NeMo-RL's on a GPU, keeps the step in its param groups).
- the CUDA tensor-type checks of gradient clipping (``clip_grads.py:174``) and of the
  distributed optimizer (``distrib_optimizer.py:477``): while they run, a CPU tensor's
  ``type()`` names the CUDA type.

NeMo-RL's worker (``MegatronPolicyWorkerImpl``):

- ``get_free_memory_bytes`` (``base_policy_worker.py:96``, main ``:157``, NVML): the
  machine's available RAM.
- ``move_model`` / ``move_optimizer`` (:1595, :1643; main :3194, :3237: offloading to the CPU
  around refits and log-prob passes): the model already lives in CPU memory. Run as written,
  megatron-core's ``offload_to_cpu`` (``param_and_grad_buffer.py:1631``, 0.20.0 ``:1637``)
  takes ``param_data.cpu()``, which on the CPU is the buffer itself, then frees it: the
  reloaded weights are garbage (NaN).
- the refit's weight transports (``stream_weights_via_ipc_zmq``, :1376, main :2476, CUDA IPC
  over ZMQ; ``broadcast_weights_for_collective``, :1396, main :2496, NCCL): every rank runs
  Megatron-Bridge's export (it gathers the shards), rank 0 posts the Hugging Face state dict
  through Ray's object store (:mod:`nemo_mmpo.cpu.answers.vllm_refit`), where the vLLM
  engine's CPU answer takes it.
- the garbage collector (``gc.collect()`` in ``offload_before_refit``, ``offload_after_refit``,
  ``prepare_for_lp_inference`` and ``train``, worker :1056, 1088, 1430, 1459, 1468, 1566; main
  :2000, 2032, 2989, 3046, 3055, 3160, 3412; several times a step): once the worker is built
  (``__init__`` returned) what it holds is frozen (``gc.freeze()``, after one collection), so
  each later ``gc.collect()`` walks only what was made since instead of the million objects
  the imports and the model left (0.57 s a call on this project's 2-core machine: about half
  the worker's CPU in a tiny run's step, py-spy, 2026-11-28). Frozen objects are still freed
  when nothing refers to them; only a cycle among them outlives its last reference. Nothing
  the worker computes changes.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from nemo_mmpo.cpu.answers import import_hooks

#: Ray's ``worker_process_setup_hook`` for a run with NeMo-RL's Megatron worker (and vLLM).
SETUP_HOOK = "nemo_mmpo.cpu.answers.megatron_shims.install_on_import"

_WORKER = "nemo_rl.models.policy.workers.megatron_policy_worker"
_DONE: set[str] = set()
_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "randn", "rand")
_LIKE_FACTORIES = ("empty_like", "zeros_like", "ones_like", "full_like", "rand_like")


def _once(name: str) -> bool:
    """True the first time ``name`` is asked for in this process."""
    if name in _DONE:
        return False
    _DONE.add(name)
    return True


def _is_cuda(device: Any) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, int) and not isinstance(device, bool):
        return True  # a CUDA device index
    return getattr(device, "type", None) == "cuda"


# --- import time ------------------------------------------------------------------------------
class _AbsentClass(type):
    """A stand-in class whose attributes are more stand-in classes (``te.ops.Sequential``)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _AbsentClass(name, (), {})


def _absent_module(name: str) -> ModuleType:
    module = ModuleType(name)
    module.__getattr__ = lambda attribute: _AbsentClass(attribute, (), {})  # type: ignore[method-assign]
    return module


@contextlib.contextmanager
def _transformer_engine_stand_in():
    """``transformer_engine`` and ``transformer_engine.pytorch`` as stand-ins for the block."""
    names = ("transformer_engine", "transformer_engine.pytorch")
    saved = {name: sys.modules.get(name) for name in names}
    package = _absent_module(names[0])
    package.pytorch = _absent_module(names[1])
    sys.modules.update({names[0]: package, names[1]: package.pytorch})
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _lora_layers_without_te(execute: Callable[[Any], None]) -> Callable[[Any], None]:
    def run(module: Any) -> None:
        with _transformer_engine_stand_in():
            execute(module)

    return run


# --- torch -------------------------------------------------------------------------------------
def _gloo_instead_of_nccl() -> None:
    import torch.distributed as dist

    init, new_group = dist.init_process_group, dist.new_group

    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        if backend is None or "nccl" in str(backend):
            backend = "gloo"
        return init(backend, *args, **kwargs)

    def new_group_gloo(*args: Any, **kwargs: Any) -> Any:
        if "nccl" in str(kwargs.get("backend")):
            kwargs["backend"] = "gloo"
        return new_group(*args, **kwargs)

    dist.init_process_group, dist.new_group = init_process_group, new_group_gloo
    barrier = dist.barrier
    # barriers with device_ids: megatron-core parallel_state.py:1033, 1504 (0.19.2 and 0.20.0,
    # SHARP groups only); Megatron-Bridge initialize.py:754, 756 (8c46dc42: :751, 753), when
    # torch.distributed is not yet initialized: gloo is given none
    dist.barrier = lambda *args, device_ids=None, **kwargs: barrier(*args, **kwargs)


class _CPUStream:
    """A CUDA stream on the CPU: nothing runs asynchronously, so it waits for nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_event(self, *args: Any) -> None:
        return None

    def wait_stream(self, *args: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def record_event(self, *args: Any) -> None:
        return None


def _cpu_device_questions() -> None:
    import torch

    torch.cuda.set_device = lambda *args, **kwargs: None
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_name = lambda *args, **kwargs: "cpu"
    for counter in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
        setattr(torch.cuda, counter, lambda *args, **kwargs: 0)
    stream = _CPUStream()
    torch.cuda.current_stream = lambda *args, **kwargs: stream
    torch.cuda.Stream = _CPUStream  # a class: annotations use ``torch.cuda.Stream | None``
    torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.get_rng_state = lambda *args, **kwargs: torch.empty(0, dtype=torch.uint8)
    torch.cuda.set_rng_state = lambda *args, **kwargs: None


def _cpu_tensor_factories() -> None:
    import torch

    def on_cpu(factory: Callable) -> Callable:
        @functools.wraps(factory)
        def make(*args: Any, **kwargs: Any) -> torch.Tensor:
            if _is_cuda(kwargs.get("device")):
                kwargs["device"] = "cpu"
            kwargs.pop("pin_memory", None)
            return factory(*args, **kwargs)

        return make

    for name in (*_FACTORIES, *_LIKE_FACTORIES):
        setattr(torch, name, on_cpu(getattr(torch, name)))
    to = torch.Tensor.to

    def to_cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        args = tuple("cpu" if _is_cuda(arg) else arg for arg in args)
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        return to(self, *args, **kwargs)

    torch.Tensor.to = to_cpu
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self


def answer_torch() -> None:
    """The torch-level answers above, in this process (idempotent; refused where torch sees
    a CUDA device, :func:`~nemo_mmpo.cpu.answers.import_hooks.refuse_on_cuda`)."""
    import_hooks.refuse_on_cuda("the torch-level answers (megatron_shims.answer_torch)")
    if _once("torch"):
        _gloo_instead_of_nccl()
        _cpu_device_questions()
        _cpu_tensor_factories()
        _answer_megatron_core()


# --- megatron-core -----------------------------------------------------------------------------
def _cuda_type_names(function: Callable) -> Callable:
    """``function`` during which a CPU tensor's ``type()`` names its CUDA type."""
    import torch

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        tensor_type = torch.Tensor.type

        def cuda_name(self: torch.Tensor, *type_args: Any, **type_kwargs: Any) -> Any:
            name = tensor_type(self, *type_args, **type_kwargs)
            if isinstance(name, str) and name.startswith("torch.") and not type_args:
                return name.replace("torch.", "torch.cuda.", 1)
            return name

        torch.Tensor.type = cuda_name
        try:
            return function(*args, **kwargs)
        finally:
            torch.Tensor.type = tensor_type

    return run


def _cpu_rng_tracker_methods() -> None:
    """``CudaRNGStatesTracker.add`` / ``fork`` on the CPU generator (``random.py:303``, 0.19.2
    and 0.20.0 alike)."""
    import torch
    from megatron.core.tensor_parallel import random as megatron_random

    tracker = megatron_random.CudaRNGStatesTracker

    def add(self: Any, name: str, seed: int) -> None:
        self._is_initialized = True
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        self.seeds_.add(seed)
        if name in self.states_:
            raise Exception(f"cuda rng state {name} already exists")
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self: Any, name: str = megatron_random._MODEL_PARALLEL_RNG_TRACKER_NAME):
        if name not in self.states_:
            raise Exception(f"cuda rng state {name} is not added")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)

    tracker.add, tracker.fork = add, fork


def _fresh_optimizer_loads(optimizer_class: type) -> None:
    """Loading a checkpoint into a fresh distributed optimizer over torch's Adam (no TE or
    Apex) fails at ``distrib_optimizer.py:839`` (``state_dict`` reads ``step`` from an empty
    state; the file is the same in megatron-core 0.19.2 and 0.20.0): its state is first filled
    with megatron-core's own dummy values (``_init_optimizer_states_with_dummy_values``,
    ``:1422``, what its ``fsdp_dtensor`` path does, ``:1641-1643``), which the loaded values
    then replace."""
    sharded_state_dict = optimizer_class.sharded_state_dict

    @functools.wraps(sharded_state_dict)
    def with_state(
        self: Any, model_sharded_state_dict: Any = None, is_loading: bool = False, **kwargs: Any
    ) -> Any:
        if is_loading and not self.optimizer.state:
            self._init_optimizer_states_with_dummy_values()
        return sharded_state_dict(self, model_sharded_state_dict or {}, is_loading, **kwargs)

    optimizer_class.sharded_state_dict = with_state


def _own_adam_steps(optimizer_class: type) -> None:
    """A distributed optimizer over torch's Adam (no TE or Apex) that loads a checkpoint ends
    with the wrong Adam step in its per-parameter state, though the checkpoint's param groups
    hold the right one: megatron-core puts one ``torch.tensor(step)`` into every parameter's
    state (``distrib_optimizer.py:1028-1032``, megatron-core 0.19.2 and 0.20.0 alike: the file
    is unchanged; torch 2.11.0's ``load_state_dict`` keeps it uncast,
    ``torch/optim/optimizer.py:797-801``), then copies over it the pre-load ``step`` its
    ``dp_reshardable`` load template kept as a non-persistent object (``:1953-1957`` into
    ``:1219-1225``), and the next step advances that one tensor once per parameter
    (``torch/optim/adam.py:414``). A resumed step then ran with another step's bias
    corrections. NeMo-RL's GPU install never takes this path (Transformer Engine's
    ``FusedAdam`` keeps the step in its param groups, ``:852-863``); a GPU without TE or Apex
    would. Each parameter gets its own tensor with the loaded param groups' step, the value
    megatron-core means to restore (``:1024-1028``); if megatron-core already restores it, the
    load fails saying so (the answer is then to go)."""
    import torch

    load_state_dict = optimizer_class.load_state_dict

    @functools.wraps(load_state_dict)
    def load_with_own_steps(self: Any, state_dict: Any) -> None:
        load_state_dict(self, state_dict)
        states = [state for state in self.optimizer.state.values() if "step" in state]
        groups = state_dict.get("optimizer", {}).get("param_groups", [])
        (step,) = {float(group["step"]) for group in groups if "step" in group} or {None}
        if len(states) < 2 or step is None:
            return
        shared = len({id(state["step"]) for state in states}) < len(states)
        if not shared and all(float(state["step"]) == step for state in states):
            raise RuntimeError(
                "megatron-core's DistributedOptimizer.load_state_dict now restores each Adam "
                "step (distrib_optimizer.py:1028-1032, :1219-1225 in 0.19.2 and 0.20.0 did "
                "not): remove the _own_adam_steps answer from nemo_mmpo's megatron_shims"
            )
        for state in states:
            state["step"] = torch.tensor(step, dtype=torch.float32)

    optimizer_class.load_state_dict = load_with_own_steps


def _torch_pickles_tensors() -> None:
    """Importing megatron-core replaces ``torch.storage._load_from_bytes`` (its ``__init__``:
    a ``weights_only`` loader), and a tensor pickled afterwards names megatron-core's function:
    it unpickles only where megatron-core imports. In NeMo-RL's layout the driver's and the
    vLLM worker's environments have none, so the driver cannot read the worker's log-probs.
    v0.7.0's own Megatron-LM pin is not public (PyPI's 0.19.2 stands in for it here,
    docs/cpu-answers.md) and may not do this; torch's loader is put back so the worker's
    results read as with a megatron-core that leaves torch alone."""
    import torch.storage

    loader = torch.storage._load_from_bytes
    import megatron.core  # noqa: F401  (replaces it on its first import)

    if loader.__module__ != "torch.storage":
        raise RuntimeError(
            "nemo-mmpo: megatron.core was imported before the CPU answers, so torch's own "
            "storage loader is lost and the Megatron worker's tensors would unpickle only where "
            f"megatron-core imports ({loader.__module__}.{loader.__name__})"
        )
    torch.storage._load_from_bytes = loader


def _answer_megatron_core() -> None:
    _torch_pickles_tensors()
    from megatron.core.optimizer import clip_grads, distrib_optimizer
    from megatron.core.optimizer import optimizer as megatron_optimizer

    _cpu_rng_tracker_methods()
    clip = _cuda_type_names(clip_grads.clip_grad_by_total_norm_fp32)
    clip_grads.clip_grad_by_total_norm_fp32 = clip
    megatron_optimizer.clip_grad_by_total_norm_fp32 = clip
    _fresh_optimizer_loads(distrib_optimizer.DistributedOptimizer)
    if not distrib_optimizer.HAVE_APEX_OR_TE:
        _own_adam_steps(distrib_optimizer.DistributedOptimizer)
    groups = distrib_optimizer.DistributedOptimizer._build_model_and_main_param_groups
    distrib_optimizer.DistributedOptimizer._build_model_and_main_param_groups = staticmethod(
        _cuda_type_names(groups)
    )


# --- Megatron-Bridge ---------------------------------------------------------------------------
def _answer_initialize(module: Any) -> None:
    """``initialize_megatron`` without CUDA, ``compile_helpers`` and ``_set_random_seed``."""
    import torch

    initialize = module.initialize_megatron

    @functools.wraps(initialize)
    def initialize_megatron(cfg: Any, *args: Any, **kwargs: Any) -> Any:
        cfg.dist.distributed_backend = "gloo"
        kwargs["allow_no_cuda"] = True
        return initialize(cfg, *args, **kwargs)

    seed = module._set_random_seed

    @functools.wraps(seed)
    def set_random_seed(*args: Any, **kwargs: Any) -> Any:
        device_count = torch.cuda.device_count
        torch.cuda.device_count = lambda: 1
        try:
            return seed(*args, **kwargs)
        finally:
            torch.cuda.device_count = device_count

    module.initialize_megatron = initialize_megatron
    module._set_random_seed = set_random_seed
    module.compile_helpers = lambda: None


#: Transformer Engine's or Apex's fused kernels a Megatron-Bridge provider switches on
#: (``llama_bridge.py:67-71``, 8c46dc42 ``:57-60``; megatron-core refuses ``apply_rope_fusion``
#: without TE, ``transformer_config.py:2185``, 0.20.0 ``:2250``)
TE_FUSIONS = ("apply_rope_fusion", "masked_softmax_fusion", "persist_layer_norm")


def _answer_auto_bridge(module: Any) -> None:
    """``AutoBridge.to_megatron_provider`` (``auto_bridge.py:1638``, 8c46dc42 ``:1906``) gives a
    provider with Transformer Engine's layer spec (``gpt_provider.py:120``) and TE fusions: on
    the CPU, the local spec with the plain-torch core attention, and those fusions off.
    NeMo-RL's Hugging Face import writes the provider into its ``run_config.yaml``, so the
    training worker (and NeMo-RL's checkpoint converter) build the same local model."""
    from megatron.bridge.utils.instantiate_utils import register_allowed_target_prefix

    from nemo_mmpo.cpu.answers.megatron_attention import cpu_layer_spec

    # run_config.yaml names the spec by its module: Megatron-Bridge's allowlist of _target_s
    # (instantiate_utils.py:165-166, 8c46dc42 :167-168) takes more prefixes by its own
    # registration function
    register_allowed_target_prefix(cpu_layer_spec.__module__)
    to_provider = module.AutoBridge.to_megatron_provider

    @functools.wraps(to_provider)
    def to_megatron_provider(self: Any, *args: Any, **kwargs: Any) -> Any:
        provider = to_provider(self, *args, **kwargs)
        provider.transformer_layer_spec = cpu_layer_spec
        for fusion in TE_FUSIONS:
            if hasattr(provider, fusion):
                setattr(provider, fusion, False)
        return provider

    module.AutoBridge.to_megatron_provider = to_megatron_provider


def _answer_setup(module: Any) -> None:
    """NeMo-RL's ``setup.py`` imported ``initialize_megatron`` by name (``:45``, main ``:49``); its
    checkpoint config (``_create_checkpoint_config``, ``:907``; main ``:1250``) saves
    synchronously: NeMo-RL main's recipes ask for asynchronous saves, whose default strategy
    (Megatron-Bridge ``training/config.py:521``, ``nvrx``) needs ``nvidia-resiliency-ext``, a
    CUDA package (the files written are the same)."""
    from megatron.bridge.training import initialize

    module.initialize_megatron = initialize.initialize_megatron
    checkpoint_config = module._create_checkpoint_config

    @functools.wraps(checkpoint_config)
    def synchronous_checkpoint_config(*args: Any, **kwargs: Any) -> Any:
        config = checkpoint_config(*args, **kwargs)
        config.async_save = False
        return config

    module._create_checkpoint_config = synchronous_checkpoint_config


# --- NeMo-RL's worker --------------------------------------------------------------------------
def _available_memory_bytes(self: Any) -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def _publish_weights(self: Any, *args: Any, **kwargs: Any) -> None:
    """Every rank exports (Megatron-Bridge gathers the shards); rank 0 posts the state dict."""
    import ray
    import torch

    from nemo_mmpo.cpu.answers import vllm_refit

    with torch.no_grad():
        weights = {
            name: tensor.detach().clone()
            for name, tensor in self._iter_params_with_optional_kv_scales()
        }
    if torch.distributed.get_rank() == 0:
        box = ray.get_actor(vllm_refit.MAILBOX)
        ray.get(vllm_refit.publish_state(weights, box))


def _answer_worker(module: Any) -> None:
    import ray

    if not getattr(ray.get_gpu_ids, "_nemo_mmpo_cpu", False):
        get_gpu_ids = ray.get_gpu_ids

        def gpu_ids() -> list:
            return get_gpu_ids() or [0]

        gpu_ids._nemo_mmpo_cpu = True  # type: ignore[attr-defined]
        ray.get_gpu_ids = gpu_ids
    answers = {
        "get_free_memory_bytes": _available_memory_bytes,
        "move_model": lambda self, model, *args, **kwargs: model,
        "move_optimizer": lambda self, *args, **kwargs: None,
        "stream_weights_via_ipc_zmq": _publish_weights,
        "broadcast_weights_for_collective": _publish_weights,
        "init_collective": lambda self, *args, **kwargs: None,
    }
    for cls in _worker_classes(module):
        for name, answer in answers.items():
            setattr(cls, name, answer)
        if not getattr(cls.__init__, "_nemo_mmpo_cpu", False):
            cls.__init__ = _frozen_once_built(cls.__init__)


def _frozen_once_built(init: Callable) -> Callable:
    """``init``, then one collection and ``gc.freeze()``: the worker's later ``gc.collect()``
    calls walk only the objects made after it was built."""

    @functools.wraps(init)
    def build(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        gc.collect()
        gc.freeze()

    build._nemo_mmpo_cpu = True  # type: ignore[attr-defined]
    return build


def _worker_classes(module: Any) -> list[type]:
    """The worker implementation and the class Ray built for the ``@ray.remote`` actor (it
    copies the methods when the decorator runs, so both are answered)."""
    classes = [module.MegatronPolicyWorkerImpl]
    metadata = getattr(module.MegatronPolicyWorker, "__ray_metadata__", None)
    if metadata is not None:
        classes.append(metadata.modified_class)
    return classes


AFTER_IMPORT: import_hooks.Shims = {
    "megatron.bridge.training.initialize": _answer_initialize,
    "megatron.bridge.models.conversion.auto_bridge": _answer_auto_bridge,
    "nemo_rl.models.megatron.setup": _answer_setup,
    _WORKER: _answer_worker,
}
BEFORE_IMPORT: import_hooks.Shims = {
    # the torch answers before NeMo-RL's Megatron modules exist in this process
    _WORKER: lambda module: answer_torch(),
    "nemo_rl.models.megatron.setup": lambda module: answer_torch(),
}


class _LoraLayersFinder(import_hooks.ShimOnImport):
    """Runs ``megatron.bridge.peft.lora_layers`` with the Transformer Engine stand-in."""

    NAME = "megatron.bridge.peft.lora_layers"

    def __init__(self) -> None:
        super().__init__({self.NAME: lambda module: None})

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        spec = super().find_spec(name, path, target)
        if name == self.NAME and spec is not None and spec.loader is not None:
            spec.loader.exec_module = _lora_layers_without_te(spec.loader.exec_module)
        return spec


def install_on_import() -> None:
    """The Megatron worker's CPU answers (and the vLLM engine's: the recipe refits NeMo-RL's
    ``VllmGeneration``) in this process, applied as NeMo-RL's modules are imported."""
    from nemo_mmpo.cpu.answers import vllm_shims

    vllm_shims.install_on_import()
    import_hooks.install(AFTER_IMPORT, BEFORE_IMPORT)
    if not any(isinstance(finder, _LoraLayersFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _LoraLayersFinder())
