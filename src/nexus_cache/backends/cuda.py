"""CUDA backend: CuPy arrays in a dedicated memory pool per device.

CuPy is imported when the backend is constructed, never at module import, so
``import nexus_cache`` works without it. Each allocation domain owns its own
``cupy.cuda.MemoryPool``; allocations are routed into it with
``cupy.cuda.using_allocator`` (thread-local, so other threads' work keeps
using CuPy's default pool) and measured from the pooled block sizes, which
CuPy rounds to 512 bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from nexus_cache.backends.base import (
    AllocationDomain,
    AllocationScope,
    DeviceBackend,
    MemoryInfo,
)
from nexus_cache.errors import BackendUnavailableError, LifecycleError

__all__ = ["CudaAllocationDomain", "CudaBackend"]


def _import_cupy() -> Any:
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        raise BackendUnavailableError(
            f"the cuda device backend needs CuPy ({exc}); install nexus-cache[gpu] "
            "or set NEXUS_DEVICE_BACKEND=host"
        ) from exc
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        raise BackendUnavailableError(
            f"the cuda device backend found no usable GPU ({exc}); set NEXUS_DEVICE_BACKEND=host"
        ) from exc
    if count < 1:
        raise BackendUnavailableError(
            "the cuda device backend found no GPU; set NEXUS_DEVICE_BACKEND=host"
        )
    return cupy


class CudaBackend(DeviceBackend):
    """CuPy backend over the visible CUDA devices. Thread-safe.

    Raises :class:`BackendUnavailableError` when CuPy or a GPU is missing.
    """

    name = "cuda"

    def __init__(self) -> None:
        self._cp = _import_cupy()
        self._count = int(self._cp.cuda.runtime.getDeviceCount())

    @property
    def xp(self) -> Any:
        return self._cp

    @property
    def sparse(self) -> Any:
        import cupyx.scipy.sparse

        return cupyx.scipy.sparse

    def device_count(self) -> int:
        return self._count

    def mem_info(self, device_id: int) -> MemoryInfo:
        self.check_device(device_id)
        with self._cp.cuda.Device(device_id):
            free, total = self._cp.cuda.runtime.memGetInfo()
        return MemoryInfo(int(free), int(total))

    def create_domain(self, device_id: int) -> CudaAllocationDomain:
        self.check_device(device_id)
        return CudaAllocationDomain(self._cp, device_id)

    def synchronize(self, device_id: int, streams: Iterable[Any] = ()) -> None:
        self.check_device(device_id)
        streams = list(streams)
        device = self._cp.cuda.Device(device_id)
        with device:
            if not streams:
                # Nothing recorded: only a whole-device sync proves the memory idle.
                device.synchronize()
            for stream in streams:
                stream.synchronize()


class CudaAllocationDomain(AllocationDomain):
    """A dedicated CuPy memory pool on one device. Thread-safe."""

    kind = "CUDA"

    def __init__(self, cupy: Any, device_id: int) -> None:
        super().__init__(device_id)
        self._cp = cupy
        with cupy.cuda.Device(device_id):
            self._pool = cupy.cuda.MemoryPool()

    @property
    def xp(self) -> Any:
        return self._cp

    def _malloc(self, size: int) -> Any:
        self.require_open()
        ptr = self._pool.malloc(size)
        self.count_allocation(int(ptr.mem.size))
        return ptr

    @contextmanager
    def scope(self) -> Iterator[AllocationScope]:
        cp = self._cp
        scope = self._push_scope()
        try:
            with cp.cuda.Device(self.device_id), cp.cuda.using_allocator(self._malloc):
                yield scope
        finally:
            self._pop_scope(scope)

    def empty(self, shape: int | tuple[int, ...], dtype: Any) -> Any:
        with self.scope():
            return self._cp.empty(shape, dtype)

    def copy_in(self, array: Any) -> Any:
        cp = self._cp
        with self.scope():
            if isinstance(array, cp.ndarray):
                out = cp.empty(array.shape, array.dtype)
                cp.copyto(out, array)
            else:
                import numpy as np

                src = np.ascontiguousarray(array)
                out = cp.empty(src.shape, src.dtype)
                out.set(src)
        return out

    def root_of(self, array: Any) -> Any:
        root = array
        while getattr(root, "base", None) is not None:
            root = root.base
        return root

    def allocation_bytes(self, array: Any) -> int:
        root = self.root_of(array)
        if not isinstance(root, self._cp.ndarray) or root.device.id != self.device_id:
            raise LifecycleError(
                f"array is not a CuPy array of CUDA device {self.device_id}; "
                "allocate it with the domain's empty() or copy_in()"
            )
        if root.data.ptr == 0:
            return 0
        return int(root.data.mem.size)

    def physical_usage(self) -> tuple[int, int]:
        return int(self._pool.used_bytes()), int(self._pool.total_bytes())

    def release_unused(self) -> int:
        pool = self._pool
        with self._cp.cuda.Device(self.device_id):
            before = int(pool.total_bytes())
            pool.free_all_blocks()
            returned = before - int(pool.total_bytes())
        self.count_release(returned)
        return returned
