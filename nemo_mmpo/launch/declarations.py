"""NeMo-RL's own config declarations, read from a checkout's source without importing ``nemo_rl``.

NeMo-RL's ``run_grpo.py`` validates the resolved config with ``MasterConfig(**config)``
(``nemo_rl/algorithms/grpo.py``: a pydantic model over its sections' ``TypedDict`` s in v0.7.0,
over pydantic models and ``TypedDict`` s on main). Importing that module needs torch, Ray, vLLM
and the GPU libraries, which a login node lacks; so :func:`declared_class` reads the class and
every declaration it names (transitively, across NeMo-RL's modules) from the source with
:mod:`ast`, and executes only those statements, with pydantic and :mod:`typing` as the real
thing. The result is NeMo-RL's own ``MasterConfig``: the same fields, types, defaults and
validators, checked by pydantic exactly as ``run_grpo.py`` checks them.

What a declaration names from outside NeMo-RL, :mod:`typing`, pydantic and the standard
library's typing helpers (``torch.dtype``, a transformers class) is read as ``typing.Any``: it
accepts anything, as a login node cannot tell. On Python < 3.12, ``typing.TypedDict`` is read as
``typing_extensions.TypedDict`` (pydantic refuses the former there); the declarations are the
same.
"""

from __future__ import annotations
import __future__

import ast
import functools
import itertools
import sys
import types
from pathlib import Path
from typing import Any

import typing_extensions

#: modules whose names a declaration may use as they are
REAL_MODULES = (
    "typing",
    "typing_extensions",
    "pydantic",
    "collections",
    "collections.abc",
    "enum",
    "dataclasses",
    "annotated_types",
    "abc",
    "functools",
    "os",
    "pathlib",
    "math",
    "warnings",
)
_FUTURE_ANNOTATIONS = __future__.annotations.compiler_flag
_counter = itertools.count()


class _UnknownMeta(type):
    """Names from outside the declarations: any attribute or subscript is unknown too."""

    def __getattr__(cls, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return unknown(f"{cls.__name__}.{name}")

    def __getitem__(cls, item: Any) -> type:
        return cls


class _Unknown(metaclass=_UnknownMeta):
    """A type a login node cannot know (``torch.dtype``): pydantic accepts any value for it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.any_schema()


def unknown(name: str) -> type:
    """A new unknown type named ``name`` (a class of its own, so it can be a base class)."""
    return _UnknownMeta(name, (_Unknown,), {})


def _real(module: str, name: str) -> Any:
    if module == "typing" and hasattr(typing_extensions, name):
        return getattr(typing_extensions, name)  # TypedDict that pydantic accepts on 3.11
    imported = __import__(module, fromlist=[name])
    return getattr(imported, name)


def _names_in(node: ast.AST) -> set[str]:
    """Every name ``node`` uses, those inside string annotations too."""
    names = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            names.add(child.id)
        elif isinstance(child, ast.Constant) and isinstance(child.value, str):
            try:
                names |= _names_in(ast.parse(child.value.strip(), mode="eval"))
            except SyntaxError:
                continue
    return names


class _SourceModule:
    """One NeMo-RL module's top-level statements, by the names they bind."""

    def __init__(self, reader: DeclarationReader, name: str, path: Path) -> None:
        self.reader = reader
        self.name = name
        self.path = path
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        self.future_annotations = any(
            isinstance(node, ast.ImportFrom)
            and node.module == "__future__"
            and any(alias.name == "annotations" for alias in node.names)
            for node in tree.body
        )
        #: name -> the statement that binds it (the last one wins, as when the module runs)
        self.statements: dict[str, ast.stmt] = {}
        #: name -> (absolute module, attribute or None for ``import module``)
        self.imports: dict[str, tuple[str, str | None]] = {}
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (base, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.asname or alias.name.partition(".")[0]
                    self.imports[bound] = (alias.name if alias.asname else bound, None)
            elif isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                self.statements[node.name] = node
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for bound in ast.walk(target):
                        if isinstance(bound, ast.Name):
                            self.statements[bound.id] = node
        self.namespace = types.ModuleType(f"_nemo_mmpo_declared_{next(_counter)}.{name}")
        # pydantic resolves string annotations in the class's module: make it findable
        sys.modules[self.namespace.__name__] = self.namespace
        self.resolving: set[str] = set()

    def resolve(self, name: str) -> Any:
        """The object ``name`` is bound to in this module (executing what it needs first)."""
        if name in self.namespace.__dict__:
            return self.namespace.__dict__[name]
        if name in self.imports:
            module, attribute = self.imports[name]
            bound = self.reader.imported(module, attribute)
        elif name in self.statements:
            bound = self._execute(name)
        else:
            return None
        self.namespace.__dict__[name] = bound
        return bound

    def _execute(self, name: str) -> Any:
        statement = self.statements[name]
        if name in self.resolving:  # a declaration naming itself: bound once it runs
            return None
        self.resolving.add(name)
        try:
            for used in sorted(_names_in(statement) - {name}):
                if used not in self.namespace.__dict__:
                    value = self.resolve(used)
                    if value is not None:
                        self.namespace.__dict__[used] = value
            code = compile(
                ast.Module(body=[statement], type_ignores=[]),
                str(self.path),
                "exec",
                flags=_FUTURE_ANNOTATIONS if self.future_annotations else 0,
                dont_inherit=True,
            )
            try:
                exec(code, self.namespace.__dict__)
            except Exception:
                return unknown(name)  # it computes with what the login node lacks: unchecked
            return self.namespace.__dict__.get(name, unknown(name))
        finally:
            self.resolving.discard(name)


class DeclarationReader:
    """NeMo-RL's declarations under ``root`` (a checkout holding ``nemo_rl/``), by module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: dict[str, _SourceModule | None] = {}

    def module(self, name: str) -> _SourceModule | None:
        if name not in self.modules:
            relative = Path(*name.split("."))
            candidates = (relative.with_suffix(".py"), relative / "__init__.py")
            for path in (self.root / candidate for candidate in candidates):
                if path.is_file():
                    self.modules[name] = _SourceModule(self, name, path)
                    break
            else:
                self.modules[name] = None
        return self.modules[name]

    def imported(self, module: str, attribute: str | None) -> Any:
        """What ``from module import attribute`` (or ``import module``) binds here."""
        if module.split(".")[0] == "nemo_rl":
            if attribute is not None:
                source = self.module(module)
                value = source.resolve(attribute) if source is not None else None
                if value is not None:
                    return value
            return unknown(f"{module}.{attribute}")  # a submodule, or a name not found
        if module in REAL_MODULES:
            try:
                return _real(module, attribute) if attribute else __import__(module)
            except (ImportError, AttributeError):
                pass
        return unknown(f"{module}.{attribute}" if attribute else module)


@functools.lru_cache(maxsize=8)
def declared_class(root: Path, module: str = "nemo_rl.algorithms.grpo", name: str = "MasterConfig"):
    """NeMo-RL's ``module.name`` as declared in the checkout at ``root`` (None if absent)."""
    (value,) = declared_objects(root, module, (name,))
    return value if isinstance(value, type) else None


@functools.lru_cache(maxsize=8)
def declared_objects(root: Path, module: str, names: tuple[str, ...]) -> tuple[Any, ...]:
    """NeMo-RL's ``module.<name>`` for each of ``names`` (a class, or a function such as a
    validator that checks it), read by one reader so that they share their declarations (None
    for a name the module lacks)."""
    source = DeclarationReader(root).module(module)
    return tuple(
        source.resolve(name) if source is not None and name in source.statements else None
        for name in names
    )
