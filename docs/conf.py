"""Sphinx configuration for the nemo-mmpo documentation (MyST Markdown pages + autodoc).

Build (CI runs this from scripts/test.sh; warnings are errors, references are checked):
    python -m sphinx -W --keep-going -n -b html docs docs/_build/html
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's nemo_mmpo, not an installed copy

project = "nemo-mmpo"
author = "nemo-mmpo developers"
copyright = "2026, nemo-mmpo developers"
release = __import__("nemo_mmpo").__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "results"]  # the study's committed reports: data, named by path
myst_heading_anchors = 3  # `[text](page.md#a-heading)` links are checked
myst_enable_extensions = ["colon_fence"]

# The adapter modules import NeMo-RL (and through it Ray, vLLM) lazily or at import time; the
# API reference documents them without NeMo-RL installed.
autodoc_mock_imports = ["nemo_rl", "ray", "vllm"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# -n (nitpicky): every reference must resolve. Third-party types in signatures have no
# inventory here (no network at build time), so they are named once below; a broken
# reference to our own pages or objects still fails the build.
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(torch|numpy|np|pydantic|pathlib|collections\.abc|typing|typing_extensions)(\..*)?",
    ),
    (r"py:.*", r"(Tensor|Any|Callable|Iterable|Mapping|Sequence|Literal|TypeVar|T|ndarray)"),
    (r"py:class", r"(int|float|str|bool|dict|list|tuple|None|object|type)"),
    # a TypeVar, and a NeMo-RL constant an adapter docstring names without its module
    (r"py:class", r"nemo_mmpo\.settings\.SettingsType"),
    (r"py:data", r"NEMO_RL_ESTIMATOR_KEYS"),
]

html_theme = "furo"
html_title = "nemo-mmpo"
html_static_path: list[str] = []
