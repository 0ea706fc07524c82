"""Run a function on a module when it is first imported, the module's file untouched:
:class:`ShimOnImport`, a ``sys.meta_path`` finder. Used by the CPU rig's answers
(:mod:`nemo_mmpo.cpu.answers.import_hooks`) and by the hook inside NeMo-RL's single controller
(:mod:`nemo_mmpo.nemo_rl.actor_hooks`), whose estimator can be unpickled before the
controller's module is imported."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

#: ``{module name: function(module)}``
Shims = dict[str, Callable[[Any], None]]


class ShimOnImport(importlib.abc.MetaPathFinder):
    """Runs ``before[name](module)`` just before module ``name`` executes (its namespace is
    still empty) and ``after[name](module)`` right after, the first time it is imported."""

    def __init__(self, after: Shims, before: Shims | None = None) -> None:
        self.after = after
        self.before = before or {}

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.after and name not in self.before:
            return None
        sys.meta_path.remove(self)  # find the real spec without finding ourselves
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module
        before, after = self.before.get(name), self.after.get(name)

        def exec_module(module: Any) -> None:
            if before is not None:
                before(module)
            execute(module)
            if after is not None:
                after(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
