"""On a GPU: kernels from cache hits in a new process load, resolve and compute."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

SRC = (
    "template <typename T>\n"
    "__global__ void fn(T *out, const T *in, T scale, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) out[i] = in[i] * scale + (T)1;\n"
    "}\n"
    'extern "C" __global__ void plain(int *out, int n) {\n'
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) out[i] = 3 * i;\n"
    "}\n"
)
NAMES = ("fn<float>", "fn<double>")
N = 1000


def _arch() -> str:
    from cuda.core import Device

    return f"sm_{Device(0).arch}"


def _launch_fn(obj: Any, name: str, dtype: str) -> list[float]:
    import cupy as cp
    import numpy as np
    from cuda.core import Device, LaunchConfig, launch

    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    kernel = obj.get_kernel(name)  # resolved through symbol_mapping
    x = cp.arange(N, dtype=dtype)
    out = cp.zeros_like(x)
    cp.cuda.Device(0).synchronize()
    scale = np.dtype(dtype).type(2.5)
    config = LaunchConfig(grid=(N + 127) // 128, block=128)
    launch(stream, config, kernel, out.data.ptr, x.data.ptr, scale, np.int32(N))
    stream.sync()
    return cp.asnumpy(out).tolist()


def _child(path: str, arch: str, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    try:
        import cuda.core

        from nexus_cache.program import CompileInputs, FileStreamProgramCache, cached_compile

        class NoCompiler(CompileInputs):
            def new_program(self) -> Any:
                raise AssertionError("compiled in the child; expected a cache hit")

        with FileStreamProgramCache(path) as cache:
            obj = cached_compile(
                NoCompiler(SRC, "c++", cuda.core.ProgramOptions(arch=arch)),
                "cubin",
                cache=cache,
                name_expressions=NAMES,
            )
            hits = cache.stats().hits
        queue.put(
            (
                "ok",
                hits,
                _launch_fn(obj, "fn<float>", "float32"),
                _launch_fn(obj, "fn<double>", "float64"),
            )
        )
    except BaseException as exc:  # report, don't hang the parent
        queue.put(("error", repr(exc), None, None))


def test_get_kernel_by_name_expression_after_a_hit_in_a_new_process(tmp_path: Path) -> None:
    pytest.importorskip("cupy")
    core = pytest.importorskip("cuda.core")
    from nexus_cache.program import CompileInputs, FileStreamProgramCache, cached_compile

    arch = _arch()
    root = tmp_path / "cache"
    with FileStreamProgramCache(root) as cache:
        cached_compile(
            CompileInputs(SRC, "c++", core.ProgramOptions(arch=arch)),
            "cubin",
            cache=cache,
            name_expressions=NAMES,
        )
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(str(root), arch, queue))
    child.start()
    status, hits, floats, doubles = queue.get(timeout=110)
    child.join(60)
    assert status == "ok", hits
    assert hits == 2  # binary + sidecar, no compile
    expected = [i * 2.5 + 1 for i in range(N)]
    assert floats == pytest.approx(expected)
    assert doubles == pytest.approx(expected)


def test_cuda_core_program_compile_with_our_cache_launches_after_a_hit(tmp_path: Path) -> None:
    cp = pytest.importorskip("cupy")
    core = pytest.importorskip("cuda.core")
    import numpy as np

    from nexus_cache.program import FileStreamProgramCache

    options = core.ProgramOptions(arch=_arch())
    with FileStreamProgramCache(tmp_path / "c") as cache:
        core.Program(SRC, "c++", options).compile("cubin", cache=cache)
    with FileStreamProgramCache(tmp_path / "c") as cache:
        obj = core.Program(SRC, "c++", options).compile("cubin", cache=cache)
        assert cache.stats().hits == 1
    dev = core.Device(0)
    dev.set_current()
    stream = dev.create_stream()
    out = cp.zeros(N, dtype=cp.int32)
    cp.cuda.Device(0).synchronize()
    config = core.LaunchConfig(grid=(N + 127) // 128, block=128)
    core.launch(stream, config, obj.get_kernel("plain"), out.data.ptr, np.int32(N))
    stream.sync()
    assert cp.asnumpy(out).tolist() == [3 * i for i in range(N)]
