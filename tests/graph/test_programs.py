"""The graph kernels compile through the package's program cache (real NVRTC, no GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nexus_cache._kernel_loader import compile_cubin
from nexus_cache.graph._kernels import INDEX_DTYPES, KERNEL_NAMES, intersect_source, pull_source
from nexus_cache.program import FileStreamProgramCache, describe_entries

pytest.importorskip("cuda.core")

_SOURCES = {"bfs_pull": pull_source, "pair_intersections": intersect_source}
_ELF = b"\x7fELF"


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "programs"
    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(root))
    return root


def test_every_kernel_is_one_the_graph_layer_launches() -> None:
    assert set(KERNEL_NAMES) == set(_SOURCES)
    assert {np.dtype(d).name for d in INDEX_DTYPES} == {"int32", "int64"}


@pytest.mark.parametrize("name", sorted(_SOURCES))
def test_first_compile_stores_the_cubin_and_the_second_reads_it(
    cache_dir: Path, name: str
) -> None:
    source = _SOURCES[name](np.int32, np.int64)
    cubin, compiled = compile_cubin(source, name, "sm_90")
    assert compiled
    assert cubin.startswith(_ELF)
    again, compiled_again = compile_cubin(source, name, "sm_90")
    assert not compiled_again
    assert again == cubin


def test_entries_live_in_the_default_program_cache_and_name_the_kernel(cache_dir: Path) -> None:
    compile_cubin(pull_source(np.int64, np.int32), "bfs_pull", "sm_90")
    with FileStreamProgramCache(cache_dir) as cache:
        entries = describe_entries(cache)
    assert [(e.program, e.symbols, e.target) for e in entries] == [
        ("nexus_bfs_pull", ("bfs_pull",), "sm_90")
    ]


def test_each_architecture_has_its_own_entry(cache_dir: Path) -> None:
    source = intersect_source(np.int32, np.int32)
    sm90, compiled_90 = compile_cubin(source, "pair_intersections", "sm_90")
    sm80, compiled_80 = compile_cubin(source, "pair_intersections", "sm_80")
    assert compiled_90
    assert compiled_80  # not a hit on the sm_90 entry
    assert sm80 != sm90
    with FileStreamProgramCache(cache_dir) as cache:
        targets = sorted(e.target for e in describe_entries(cache))
    assert targets == ["sm_80", "sm_90"]


def test_each_dtype_combination_has_its_own_entry(cache_dir: Path) -> None:
    for offset in INDEX_DTYPES:
        for vertex in INDEX_DTYPES:
            _, compiled = compile_cubin(pull_source(offset, vertex), "bfs_pull", "sm_90")
            assert compiled
    with FileStreamProgramCache(cache_dir) as cache:
        assert len(describe_entries(cache)) == 4


_CHILD = """
import json, sys
import numpy as np
from nexus_cache.graph._kernels import pull_source
from nexus_cache._kernel_loader import compile_cubin
cubin, compiled = compile_cubin(pull_source(np.int32, np.int32), "bfs_pull", "sm_90")
print(json.dumps({"compiled": compiled, "size": len(cubin)}))
"""


def test_a_second_process_reads_the_first_one_s_cubin(cache_dir: Path) -> None:
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "NEXUS_PROGRAM_CACHE_DIR": str(cache_dir), "PYTHONPATH": src}
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert [r["compiled"] for r in runs] == [True, False]
    assert runs[0]["size"] == runs[1]["size"] > 0
