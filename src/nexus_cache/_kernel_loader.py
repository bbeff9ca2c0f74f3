"""The package's CUDA kernels, compiled through the program cache it ships.

The one loader of every kernel of ours: the graph kernels (``graph``) and
the Parquet page-decode kernels (``frames.gpudecode``) both load here.

A kernel is compiled by NVRTC (``cuda.core`` ``Program``, with line info)
for the architecture of the device it runs on (``sm_XX``, from the device's
compute capability) through :func:`nexus_cache.program.cached_compile` into the
default file-stream program cache (``NEXUS_PROGRAM_CACHE_DIR``, else
``$XDG_CACHE_HOME/nexus-cache/program-cache``). A later process, or the
same machine after a reboot, reads the cubin from that cache instead of
compiling it; ``nexus-cache program-cache ls`` lists the entries
(``nexus_<kernel>: <kernel>``). The cubin is loaded into CuPy as a module on
the current device, and its function is launched exactly like a
``cupy.RawKernel`` (same grid, block and argument conventions).

Fallback: where ``cuda.core`` is missing, the program cache cannot be
opened, NVRTC fails, or the driver refuses the cubin, CuPy compiles the
kernel itself (``cupy.RawKernel``, cached in CuPy's own kernel cache). A
cache must never make a kernel fail: the reason is logged once per kernel
(INFO, logger ``nexus_cache.kernels``) and recorded in :func:`kernel_loads`.

Thread-safe: loads are serialized by one lock; a loaded kernel is kept for
the life of the process, one per device, kernel name and source. Process-
safe as the file-stream cache is (concurrent misses all compile; the last
store wins, and the outputs are equal).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import tempfile
import threading
import time
from typing import Any

__all__ = [
    "ORIGINS",
    "KernelLoad",
    "compile_cubin",
    "device_arch",
    "grid_blocks",
    "kernel_function",
    "kernel_loads",
]

_log = logging.getLogger("nexus_cache.kernels")

#: where a loaded kernel came from: read from the program cache, compiled by
#: NVRTC now (and stored there), or compiled by CuPy (the fallback)
ORIGINS = ("program-cache", "compiled", "cupy")


@dataclasses.dataclass(frozen=True)
class KernelLoad:
    """One kernel made ready on one device: where it came from and what it took.

    ``kernel`` names the kernel and its index types (``bfs_pull(int32,
    int64)``); ``arch`` is the target (``sm_90``), None when the device
    could not be asked; ``origin`` is one of :data:`ORIGINS`; ``seconds``
    covers the compile or cache read and the module load; ``detail`` says
    why the fallback ran (None otherwise).

    Parameters
    ----------
    kernel : str
        The kernel and its index types.
    device_id : int
        The device it was loaded on.
    arch : str or None
        The compile target, None when the device could not be asked.
    origin : str
        Where the kernel came from, one of :data:`ORIGINS`.
    seconds : float
        The time the compile or cache read and the module load took.
    detail : str or None, optional
        Why the fallback ran.

    Examples
    --------
    >>> from nexus_cache.graph import KernelLoad
    >>> load = KernelLoad("bfs_pull(int32, int32)", 0, "sm_90", "compiled", 0.25)
    >>> load.to_dict()["origin"]
    'compiled'
    """

    kernel: str
    device_id: int
    arch: str | None
    origin: str
    seconds: float
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_lock = threading.Lock()
# (device id, kernel name, source) -> the launchable function
_functions: dict[tuple[int, str, str], Any] = {}
_loads: list[KernelLoad] = []
# program-cache root -> the open FileStreamProgramCache (the root may change
# between calls: it is read from the environment each time)
_caches: dict[str, Any] = {}
# Programs built by cached_compile since import: it builds one only on a miss
_built = [0]


def grid_blocks(items: int, per_block: int, most: int = 65535 * 8) -> int:
    """The blocks of a grid-stride launch over ``items`` items, ``per_block`` to a
    block (one block at least), capped at ``most``: every kernel of ours strides
    over what a capped grid does not reach.

    >>> grid_blocks(1000, 256), grid_blocks(1, 256), grid_blocks(10**12, 1)
    (4, 1, 524280)
    """
    return max(1, min((items + per_block - 1) // per_block, most))


def kernel_loads() -> tuple[KernelLoad, ...]:
    """Every kernel this process has made ready, in load order.

    Returns
    -------
    tuple of KernelLoad
        One record per kernel and device; empty where no kernel was loaded
        (the host backend loads none).

    Examples
    --------
    >>> from nexus_cache.graph import kernel_loads
    >>> isinstance(kernel_loads(), tuple)
    True
    """
    with _lock:
        return tuple(_loads)


def device_arch(device_id: int) -> str:
    """The NVRTC target of CUDA device ``device_id``: ``sm_`` and its compute capability."""
    import cupy

    return f"sm_{cupy.cuda.Device(device_id).compute_capability}"


@functools.cache
def _counted_inputs() -> type:
    from nexus_cache.program import CompileInputs

    @dataclasses.dataclass(frozen=True)
    class CountedInputs(CompileInputs):
        """``CompileInputs`` that count the ``Program`` objects built from them."""

        def new_program(self) -> Any:
            _built[0] += 1
            return super().new_program()

    return CountedInputs


def _program_cache() -> Any:
    from nexus_cache.program import FileStreamProgramCache, default_filestream_root

    root = str(default_filestream_root())
    cache = _caches.get(root)
    if cache is None:
        # uncapped: the project's kernels are a few KiB; a user's cap on the
        # same root (set by their own cache objects) still applies to theirs
        cache = _caches[root] = FileStreamProgramCache(root)
    return cache


def compile_cubin(source: str, name: str, arch: str) -> tuple[bytes, bool]:
    """``(cubin, compiled)``: ``source`` built for ``arch`` through the program cache.

    ``name`` is the ``extern "C"`` kernel; the program is named
    ``nexus_<name>``. ``compiled`` is False when the cubin came from the
    cache. Errors of ``cuda.core``, NVRTC and the cache propagate. Call with
    the module lock held, or where nothing else compiles concurrently (the
    ``compiled`` flag counts this process's compiles).
    """
    from cuda.core import ProgramOptions

    from nexus_cache.program import cached_compile

    # line info: compute-sanitizer and profilers name the source line (unlike
    # -G it leaves optimization as it is)
    options = ProgramOptions(arch=arch, name=f"nexus_{name}", lineinfo=True)
    inputs = _counted_inputs()(source, "c++", options)
    before = _built[0]
    # The name expression makes cached_compile keep a metadata sidecar, so
    # `program-cache ls` shows the kernel's name.
    obj = cached_compile(inputs, "cubin", cache=_program_cache(), name_expressions=(name,))
    return bytes(obj.code), _built[0] != before


def _module_function(cubin: bytes, name: str) -> Any:
    """Kernel ``name`` of ``cubin``, loaded on the current device."""
    import cupy

    module_type = getattr(getattr(cupy.cuda, "function", None), "Module", None)
    if module_type is not None:
        module = module_type()
        module.load(cubin)  # cuModuleLoadData: from memory, no file
        return module.get_function(name)  # the function keeps the module loaded
    # A CuPy without the in-memory loader loads cubins from files only: one in
    # a private temporary directory, removed once the module is loaded.
    with tempfile.TemporaryDirectory(prefix="nexus-kernel-") as tmp:
        path = os.path.join(tmp, f"{name}.cubin")
        with open(path, "wb") as out:
            out.write(cubin)
        return cupy.RawModule(path=path).get_function(name)


def _load(device_id: int, name: str, source: str, label: str) -> tuple[Any, KernelLoad]:
    started = time.perf_counter()
    arch: str | None = None
    try:
        arch = device_arch(device_id)
        cubin, compiled = compile_cubin(source, name, arch)
        function = _module_function(cubin, name)
    except Exception as exc:
        import cupy

        detail = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
        _log.info("kernel %s compiled by CuPy instead of the program cache (%s)", label, detail)
        kernel = cupy.RawKernel(source, name)
        kernel.compile()  # now, so the time is counted where the load happens
        return kernel, KernelLoad(
            label, device_id, arch, "cupy", time.perf_counter() - started, detail
        )
    origin = "compiled" if compiled else "program-cache"
    return function, KernelLoad(label, device_id, arch, origin, time.perf_counter() - started)


def kernel_function(name: str, source: str, label: str | None = None) -> Any:
    """The kernel ``name`` of ``source``, ready on the current CuPy device.

    Called as ``f(grid, block, args)``, like a ``cupy.RawKernel``. The first
    call per device compiles or reads the cubin (see the module notes);
    later calls are one dictionary lookup. ``label`` names the load in
    :func:`kernel_loads` (default ``name``).
    """
    import cupy

    key = (cupy.cuda.runtime.getDevice(), name, source)
    function = _functions.get(key)
    if function is not None:
        return function
    with _lock:
        function = _functions.get(key)
        if function is None:
            function, load = _load(key[0], name, source, label or name)
            _functions[key] = function
            _loads.append(load)
    return function
