"""The program-cache demo: one real kernel, compiled through the cache twice.

Runs without a GPU (NVRTC compiles on the CPU; the demo never loads the
cubin). By default the cache lives in a fresh temporary directory that is
removed afterwards, so every run shows a genuine miss followed by a hit and
leaves nothing behind; pass ``path`` to use (and keep) a directory of your
own, where a second run of the demo hits both times.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from typing import TYPE_CHECKING, TextIO

from nexus_cache.errors import BackendUnavailableError

if TYPE_CHECKING:
    from cuda.core import ObjectCode

__all__ = ["DEMO_KERNEL", "DEMO_NAMES", "run_demo"]

DEMO_KERNEL = r"""
template <typename T>
__global__ void saxpy(T a, const T *x, T *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""
DEMO_NAMES = ("saxpy<float>", "saxpy<double>")


def _timed_compile(root: str, arch: str) -> tuple[ObjectCode, float, bool]:
    from cuda.core import ProgramOptions

    from nexus_cache.program._compile import CompileInputs, cached_compile
    from nexus_cache.program.filestream import FileStreamProgramCache

    inputs = CompileInputs(DEMO_KERNEL, "c++", ProgramOptions(arch=arch, name="nexus_demo"))
    with FileStreamProgramCache(root) as cache:  # a new cache object every time
        start = time.perf_counter()
        obj = cached_compile(inputs, "cubin", cache=cache, name_expressions=DEMO_NAMES)
        elapsed = time.perf_counter() - start
        compiled = cache.stats().stores > 0
    return obj, elapsed, compiled


def run_demo(path: str | None = None, *, arch: str = "sm_90", out: TextIO | None = None) -> int:
    """Compile the demo kernel twice through a FileStream cache; print timings.

    Returns 0 when the second compile was a hit returning the same cubin and
    symbol mapping as the first, 1 otherwise. Raises
    :class:`~nexus_cache.errors.BackendUnavailableError` when cuda.core (the
    ``cuda`` extra) is not installed.
    """
    out = out or sys.stdout
    try:
        import cuda.core  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailableError(
            "the demo compiles with cuda.core's NVRTC; install it with "
            "pip install 'nexus-cache[cuda]'"
        ) from exc

    root = path if path is not None else tempfile.mkdtemp(prefix="nexus-cache-demo-")
    try:
        print(
            f"nexus-cache demo: NVRTC -> cubin ({arch}), FileStreamProgramCache at {root}",
            file=out,
        )
        first, t1, compiled1 = _timed_compile(root, arch)
        second, t2, compiled2 = _timed_compile(root, arch)
    finally:
        if path is None:
            shutil.rmtree(root, ignore_errors=True)

    def label(compiled: bool) -> str:
        return "miss (compiled, stored)" if compiled else "hit  (no compiler run)"

    print(f"  1st compile, new cache object:   {label(compiled1)}  {t1 * 1e3:9.3f} ms", file=out)
    print(f"  2nd compile, fresh cache object: {label(compiled2)}  {t2 * 1e3:9.3f} ms", file=out)
    same = bytes(first.code) == bytes(second.code)
    mapping = second.symbol_mapping
    same_names = mapping == first.symbol_mapping
    print(f"  speed-up: {t1 / t2:,.0f}x   identical cubin: {'yes' if same else 'NO'}", file=out)
    for name in DEMO_NAMES:
        lowered = mapping.get(name, b"?")
        shown = lowered.decode() if isinstance(lowered, bytes) else str(lowered)
        print(f"  get_kernel({name!r}) resolves to {shown}", file=out)
    if path is None:
        print("  (temporary cache removed; pass --path DIR to keep one)", file=out)
    ok = same and same_names and not compiled2
    if not ok:
        print("nexus-cache demo: FAILED: the second compile was not an identical hit", file=out)
    return 0 if ok else 1
