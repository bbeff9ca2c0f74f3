"""Importing the package, or any of its sub-packages, loads no array, Arrow,
GPU or terminal library: names load their modules on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("numpy", "pyarrow", "cupy", "scipy", "numba", "networkx", "rich", "cuda", "rmm", "s3fs")
PACKAGES = [
    "nexus_cache",
    "nexus_cache.backends",
    "nexus_cache.client",
    "nexus_cache.cluster",
    "nexus_cache.device",
    "nexus_cache.frames",
    "nexus_cache.graph",
    "nexus_cache.graph.registry",
    "nexus_cache.lakehouse",  # fsspec, for its protocol: not in HEAVY
    "nexus_cache.program",
    "nexus_cache.server",
    "nexus_cache.service",
    "nexus_cache.service.queries",
]


@pytest.mark.parametrize("package", PACKAGES)
def test_importing_a_package_loads_no_heavy_library(package: str) -> None:
    code = (
        f"import sys, {package}; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
