"""Real NVRTC, real disk, real processes: a cubin stored here is a hit over there."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from nexus_cache.program import CompileInputs, FileStreamProgramCache, cached_compile

core = pytest.importorskip("cuda.core")

SRC = (
    "template <typename T>\n"
    "__global__ void fn(T *out, const T *in, T scale, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) out[i] = in[i] * scale;\n"
    "}\n"
    'extern "C" __global__ void plain(int *a) { *a = 42; }\n'
)
NAMES = ("fn<float>", "fn<double>")
ARCH = "sm_90"


class _NoCompiler(CompileInputs):
    def new_program(self) -> Any:
        raise AssertionError("the compiler ran in the child, expected a cache hit")


def _child_hit(path: str, names: tuple[str, ...], queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    import cuda.core

    inputs = _NoCompiler(SRC, "c++", cuda.core.ProgramOptions(arch=ARCH))
    with FileStreamProgramCache(path) as cache:
        obj = cached_compile(inputs, "cubin", cache=cache, name_expressions=names)
        stats = cache.stats()
    queue.put((bytes(obj.code), obj.name, obj.code_type, obj.symbol_mapping, stats.hits))


def _in_new_process(path: Path, names: tuple[str, ...]) -> tuple[Any, ...]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_hit, args=(str(path), names, queue))
    child.start()
    result = queue.get(timeout=90)
    child.join(60)
    assert child.exitcode == 0
    return result


def _fresh(names: tuple[str, ...]) -> Any:
    options = core.ProgramOptions(arch=ARCH)
    return core.Program(SRC, "c++", options).compile("cubin", name_expressions=names)


@pytest.mark.parametrize("names", [(), NAMES], ids=["plain", "name_expressions"])
def test_cubin_stored_here_hits_in_a_new_process_and_equals_a_fresh_compile(
    tmp_path: Path, names: tuple[str, ...]
) -> None:
    root = tmp_path / "cache"
    with FileStreamProgramCache(root) as cache:
        stored = cached_compile(
            CompileInputs(SRC, "c++", core.ProgramOptions(arch=ARCH)),
            "cubin",
            cache=cache,
            name_expressions=names,
        )
        assert cache.stats().stores == (2 if names else 1)  # binary (+ sidecar)

    data, name, code_type, mapping, hits = _in_new_process(root, names)
    fresh = _fresh(names)
    assert data == bytes(fresh.code) == bytes(stored.code)
    assert data[:4] == b"\x7fELF"
    assert (name, code_type) == (fresh.name, "cubin")
    assert mapping == fresh.symbol_mapping
    assert hits == (2 if names else 1)
    if names:
        assert mapping["fn<float>"] == b"_Z2fnIfEvPT_PKS0_S0_i"


def test_entries_on_disk_are_raw_cubins(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    with FileStreamProgramCache(root) as cache:
        obj = cached_compile(
            CompileInputs(SRC, "c++", core.ProgramOptions(arch=ARCH)), "cubin", cache=cache
        )
    blobs = [p.read_bytes() for p in root.rglob("*") if p.is_file()]
    assert bytes(obj.code) in blobs  # a file on disk holds exactly the cubin


def test_demo_shows_a_miss_then_an_identical_hit(tmp_path: Path) -> None:
    import io

    from nexus_cache.program._demo import run_demo

    out = io.StringIO()
    assert run_demo(str(tmp_path / "demo"), out=out) == 0
    lines = out.getvalue().splitlines()
    assert "miss (compiled, stored)" in lines[1]
    assert "hit  (no compiler run)" in lines[2]
    assert "identical cubin: yes" in out.getvalue()
    assert any(p.is_file() for p in (tmp_path / "demo").rglob("*"))  # kept: a path was given


def test_cli_demo_runs_in_a_temporary_directory(capsys: pytest.CaptureFixture[str]) -> None:
    import re

    from nexus_cache.cli.main import main

    assert main(["program-cache", "demo"]) == 0
    text = capsys.readouterr().out
    root = re.search(r"FileStreamProgramCache at (\S+)", text)
    assert root is not None
    assert not Path(root.group(1)).exists()  # removed afterwards
    assert "speed-up" in text


NVVM_IR = (
    'target datalayout = "e-p:64:64:64-i1:8:8-i8:8:8-i16:16:16-i32:32:32-i64:64:64-'
    'i128:128:128-f32:32:32-f64:64:64-v16:16:16-v32:32:32-v64:64:64-v128:128:128-n16:32:64"\n'
    """target triple = "nvptx64-nvidia-cuda"

define void @k(float* %a) {
entry:
  %v = load float, float* %a
  %m = fmul float %v, 2.0
  %n = fadd float %m, 1.0
  store float %n, float* %a
  ret void
}

!nvvm.annotations = !{!0}
!0 = !{void (float*)* @k, !"kernel", i32 1}
!nvvmir.version = !{!1}
!1 = !{i32 2, i32 0, i32 3, i32 1}
"""
)


def test_nvvm_device_code_optimize_zero_is_not_false() -> None:
    # cuda.core passes -opt=0 for device_code_optimize=False but nothing (the
    # default, -opt=3) for 0: the two compiles differ and must not share an entry.
    from nexus_cache.program import InMemoryProgramCache

    def ptx(cache: Any, level: object) -> bytes:
        options = core.ProgramOptions(arch=ARCH, device_code_optimize=level)
        return bytes(
            cached_compile(CompileInputs(NVVM_IR, "nvvm", options), "ptx", cache=cache).code
        )

    try:
        uncached_zero = ptx(InMemoryProgramCache(), 0)
    except Exception as exc:
        if "nvvm" not in str(exc).lower() and "NotFound" not in type(exc).__name__:
            raise
        pytest.skip(f"libNVVM unavailable: {exc}")
    cache = InMemoryProgramCache()
    unoptimized = ptx(cache, False)
    assert b"fma.rn.f32" not in unoptimized
    assert b"fma.rn.f32" in uncached_zero
    assert ptx(cache, 0) == uncached_zero
    assert len(cache) == 2
