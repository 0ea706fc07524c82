"""Prints which megatron-core and Megatron-Bridge this interpreter imports, and from where.

One line for the NeMo-RL suite's log (scripts/test_nemo_rl.sh), read without importing either
(megatron-core's import pulls in torch): the version of the first ``megatron-core`` distribution
on ``sys.path`` (a build in ``.nemo-rl/megatron-core-<commit>`` ahead of PyPI's), and for
Megatron-Bridge the release's version or the source folder it is imported from.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os


def located(module: str) -> str:
    """The folder ``module`` would be imported from, relative to the working directory."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return "not importable"
    return os.path.relpath(next(iter(spec.submodule_search_locations)))


def from_site_packages(folder: str) -> bool:
    return "site-packages" in folder.split(os.sep)


def main() -> None:
    core, bridge = located("megatron.core"), located("megatron.bridge")
    core_version = importlib.metadata.version("megatron-core")
    bridge_version = (
        f"PyPI {importlib.metadata.version('megatron-bridge')}"
        if from_site_packages(bridge)
        else "source"
    )
    core_origin = "PyPI" if from_site_packages(core) else "built from source"
    print(
        f"megatron-core {core_version} ({core_origin}: {core}), "
        f"Megatron-Bridge {bridge_version} ({bridge})"
    )


if __name__ == "__main__":
    main()
