"""Plug-in modules: a researcher's own estimators and losses, imported in every process.

A recipe names its plug-ins::

    nemo_mmpo:
      plugins: [my_objectives]      # my_objectives.py beside the recipe, or an installed module

and an installed package may declare an entry point in the group ``nemo_mmpo.plugins``. A
plug-in module registers at import (``@register_estimator``, ``@register_loss``). The launcher
(``nemo-mmpo train``, ``--dry-run``) imports them with :func:`load_plugins` before checking the
recipe and before ``install()`` freezes the registry; it also puts their names and folder in the
environment (:data:`PLUGINS_ENV`, :data:`PLUGIN_PATH_ENV`, ``PYTHONPATH``), which NeMo-RL hands
to its Ray workers, so a worker or actor that looks a name up imports the same modules first
(:func:`load_from_environment`, called by the registries on their first lookup).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nemo_mmpo.errors import MMPOInputError

#: the recipe's section and key naming plug-in modules
SECTION, KEY = "nemo_mmpo", "plugins"
#: the plug-in modules of this run, comma-separated (set by :func:`load_plugins`)
PLUGINS_ENV = "NEMO_MMPO_PLUGINS"
#: folders the plug-in modules were found in (``os.pathsep``-separated)
PLUGIN_PATH_ENV = "NEMO_MMPO_PLUGIN_PATH"
#: the entry-point group an installed package declares its plug-in modules under
ENTRY_POINT_GROUP = "nemo_mmpo.plugins"

_loaded: set[str] = set()


def recipe_plugins(config: Any) -> list[str]:
    """The recipe's ``nemo_mmpo.plugins`` (a list of module names), checked."""
    section = config.get(SECTION) if isinstance(config, dict) else None
    if section is None:
        return []
    if not isinstance(section, dict) or set(section) - {KEY}:
        extra = sorted(set(section) - {KEY}) if isinstance(section, dict) else section
        raise MMPOInputError(
            f"{SECTION}: {extra!r} is not a setting; the section holds {KEY}: [module, ...]"
        )
    modules = section.get(KEY) or []
    if isinstance(modules, str) or not all(isinstance(module, str) for module in modules):
        raise MMPOInputError(
            f"{SECTION}.{KEY}={modules!r}: give a list of module names, e.g. [my_objectives] "
            "for my_objectives.py beside the recipe"
        )
    for module in modules:
        if module.endswith(".py") or not all(part.isidentifier() for part in module.split(".")):
            raise MMPOInputError(
                f"{SECTION}.{KEY}: {module!r} is not a module name (for my_objectives.py beside "
                "the recipe, write my_objectives)"
            )
    return list(modules)


def _extend_path(variable: str, folder: str) -> None:
    entries = [entry for entry in os.environ.get(variable, "").split(os.pathsep) if entry]
    if folder not in entries:
        os.environ[variable] = os.pathsep.join([folder, *entries])


def _import(module: str, where: str) -> None:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is not None and module.startswith(error.name):
            raise MMPOInputError(
                f"{SECTION}.{KEY}: no module named {module!r} {where}: put {module}.py beside "
                "the recipe, or install the package that provides it"
            ) from None
        raise MMPOInputError(f"plug-in {module}: importing it failed: {error!r}") from None
    except MMPOInputError as error:
        raise MMPOInputError(f"plug-in {module}: {error}") from None
    except Exception as error:
        raise MMPOInputError(
            f"plug-in {module}: importing it failed: {type(error).__name__}: {error}"
        ) from None
    _loaded.add(module)


def load_plugins(modules: Sequence[str], folder: Path | None = None) -> list[str]:
    """Import the recipe's plug-in ``modules`` (looked up in ``folder``, the recipe's, first)
    and the installed entry points; record them in the environment for NeMo-RL's workers.
    Returns every plug-in module imported."""
    if folder is not None and modules:
        folder_text = str(Path(folder).resolve())
        if folder_text not in sys.path:
            sys.path.insert(0, folder_text)
        _extend_path(PLUGIN_PATH_ENV, folder_text)
        _extend_path("PYTHONPATH", folder_text)
    where = f"beside the recipe ({folder})" if folder is not None else "on sys.path"
    for module in modules:
        _import(module, where)
    named = [m for m in os.environ.get(PLUGINS_ENV, "").split(",") if m]
    os.environ[PLUGINS_ENV] = ",".join(dict.fromkeys([*named, *modules]))
    load_entry_points()
    return sorted(_loaded)


def load_entry_points() -> None:
    """Import the modules installed packages declare under :data:`ENTRY_POINT_GROUP`."""
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry_point.value in _loaded:
            continue
        try:
            entry_point.load()
        except Exception as error:
            raise MMPOInputError(
                f"plug-in entry point {entry_point.name} = {entry_point.value} "
                f"({ENTRY_POINT_GROUP}): importing it failed: {type(error).__name__}: {error}"
            ) from None
        _loaded.add(entry_point.value)


_environment_loaded: list[bool] = []


def load_from_environment() -> None:
    """In any process (a Ray worker, the single controller's actor): import the plug-ins the
    launcher recorded (:data:`PLUGINS_ENV`, from :data:`PLUGIN_PATH_ENV`) and the entry points,
    once."""
    if _environment_loaded:
        return
    _environment_loaded.append(True)
    for folder in os.environ.get(PLUGIN_PATH_ENV, "").split(os.pathsep):
        if folder and folder not in sys.path:
            sys.path.insert(0, folder)
    for module in os.environ.get(PLUGINS_ENV, "").split(","):
        if module and module not in _loaded:
            _import(module, f"in {PLUGIN_PATH_ENV} or on sys.path")
    load_entry_points()
