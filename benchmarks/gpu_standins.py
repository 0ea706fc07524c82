"""What the GPU check puts where the GPU machine lacks a package (it has no internet).

Each stand-in is installed only when the real package is not importable, and says so on
stdout (the check's log keeps the line):

- ``ray``: NeMo-RL imports it at module level in the worker, loss and estimator modules; the
  check constructs ``MegatronPolicyWorkerImpl`` (the class under ``@ray.remote``) in this
  process, so only the import and two calls are answered: ``ray.remote`` returns the class
  unchanged and ``ray.get_gpu_ids()`` returns ``[0]`` (the one GPU; NeMo-RL reads it at
  ``megatron_policy_worker.py:263``). Ray's wheel (~70 MiB) does not fit the 64 MiB carried.
- Transformer Engine: Megatron-Bridge's ``peft/lora_layers.py:20`` is its one unguarded
  ``import transformer_engine.pytorch`` (reached from ``models/conversion/peft_bridge.py:41``);
  a module object stands in for that one name, so every guarded TE import still finds no TE
  and the model is built with the local (non-TE) layer spec.
- experiment trackers (``mlflow``, ``swanlab``, ``wandb``): NeMo-RL's ``utils/logger.py``
  imports them at module level (reached from the loss module); the check constructs no
  ``Logger``, and wandb's wheel alone is ~27 MiB, so the absent ones get import-only modules
  in that one importer.
- ``compile_helpers``: Megatron-Bridge's ``training/initialize.py:147`` runs ``make`` in
  megatron-core's ``datasets/``; PyPI's megatron-core wheel ships the built
  ``helpers_cpp`` but no Makefile, so the call is answered with nothing to do.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any


def _say(line: str) -> None:
    print(f"[gpu-standin] {line}", flush=True)


class _AnyAttribute(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything


class _Anything(metaclass=_AnyAttribute):
    """Any attribute, call, subscript or base class: what an import-only module hands out."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _Anything()

    def __class_getitem__(cls, item: Any) -> Any:
        return cls


def _remote(*args: Any, **kwargs: Any) -> Any:
    """``@ray.remote`` and ``@ray.remote(...)``: the decorated class or function, unchanged."""
    if len(args) == 1 and not kwargs and callable(args[0]):
        return args[0]
    return lambda target: target


class _ImportOnlyModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything


class _RayFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``import ray`` and ``import ray.<anything>`` with import-only modules."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname == "ray" or fullname.startswith("ray."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _ImportOnlyModule(spec.name)
        module.__path__ = []
        if spec.name == "ray":
            module.remote = _remote
            module.get_gpu_ids = lambda: [0]
            module.is_initialized = lambda: False
            module.ObjectRef = _Anything
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a finder that hides the package (the CPU rehearsal's image gate)
        return False


def install_ray() -> bool:
    """Put the import-only ``ray`` in place when Ray is not installed; whether it did."""
    if "ray" in sys.modules or _importable("ray"):
        return False
    sys.meta_path.insert(0, _RayFinder())
    _say(
        "ray is not installed here: an import-only stand-in answers `import ray` "
        "(ray.remote returns the class unchanged, ray.get_gpu_ids() -> [0]); no Ray runs"
    )
    return True


_ANSWERS: dict[tuple[str, str], Any] = {}


def _answer_import(importer: str, name: str, module: Any) -> None:
    """``import name`` inside module ``importer`` (only there) gets ``module``."""
    import builtins

    if not _ANSWERS:
        real_import = builtins.__import__

        def importing(name, globals=None, locals=None, fromlist=(), level=0):
            answer = _ANSWERS.get(((globals or {}).get("__name__", ""), name))
            if answer is not None:
                return answer
            return real_import(name, globals, locals, fromlist, level)

        builtins.__import__ = importing
    _ANSWERS[(importer, name)] = module


def install_lora_layers_te() -> bool:
    """Let Megatron-Bridge's ``peft/lora_layers.py`` import when Transformer Engine is absent."""
    if _importable("transformer_engine"):
        return False
    te_pytorch = _ImportOnlyModule("transformer_engine.pytorch")
    _answer_import(
        "megatron.bridge.peft.lora_layers",
        "transformer_engine.pytorch",
        types.SimpleNamespace(pytorch=te_pytorch),
    )
    _say(
        "Transformer Engine is absent: megatron/bridge/peft/lora_layers.py:20's unguarded "
        "`import transformer_engine.pytorch` gets a stand-in module (that importer only); "
        "the model uses Megatron-Bridge's local layer spec"
    )
    return True


TRACKERS = ("mlflow", "swanlab", "wandb")


def install_logger_trackers() -> list[str]:
    """NeMo-RL's ``utils/logger.py:27-33`` imports the experiment trackers at module level;
    nothing here constructs its ``Logger``. The absent ones (wandb's wheel alone is ~27 MiB)
    get an import-only module in that importer only; which ones, returned."""
    absent = [name for name in TRACKERS if not _importable(name)]
    for name in absent:
        _answer_import("nemo_rl.utils.logger", name, _ImportOnlyModule(name))
    if absent:
        _say(
            f"{', '.join(absent)} absent: nemo_rl/utils/logger.py's module-level imports of "
            "them get import-only modules (that importer only); no tracker is used"
        )
    return absent


def install_compile_helpers() -> None:
    """megatron-core's wheel ships the built dataset helper and no Makefile: skip ``make``."""
    import megatron.bridge.training.initialize as initialize

    initialize.compile_helpers = lambda: None
    _say(
        "megatron/bridge/training/initialize.py:147 compile_helpers(): skipped (the "
        "megatron-core wheel ships helpers_cpp built, and no Makefile)"
    )


def install_import_answers() -> None:
    """Every import-time stand-in above (each only where its package is absent)."""
    install_ray()
    install_lora_layers_te()
    install_logger_trackers()
