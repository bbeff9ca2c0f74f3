"""RMM allocation domains for the CUDA backend (``pip install nexus-cache[rmm]``).

Each domain owns its own resource stack on its device, never the process-wide
("current device") RMM resource, so other RMM users are untouched::

    StatisticsResourceAdaptor        measured usage (current bytes)
      LimitingResourceAdaptor        at the domain limit (the cache cap)
        PoolMemoryResource           initial size 0, maximum = the limit
          CudaMemoryResource

CuPy allocations inside ``domain.scope()`` become ``rmm.DeviceBuffer`` s of the
top of that stack, on CuPy's current stream, wrapped as CuPy memory: the
mechanism of ``rmm.allocators.cupy``, bound to the domain instead of to the
device's current resource. RMM is imported only when a domain is built.

An RMM pool cannot hand part of itself back, so :meth:`release_unused`
returns memory only when the domain is empty (it then rebuilds the stack);
until then freed blocks stay held, which the reports show as
``domain_held_bytes``.
"""

from __future__ import annotations

import threading
from typing import Any

from nexus_cache.backends.base import round_allocation
from nexus_cache.backends.cupy_domain import CupyArrayDomain
from nexus_cache.errors import BackendUnavailableError, CapacityError

__all__ = ["RmmAllocationDomain", "rmm_available"]

# RMM pools grow in multiples of 256 bytes.
_POOL_ALIGNMENT = 256


def _import_rmm() -> Any:
    try:
        import rmm
        import rmm.mr
    except Exception as exc:  # ImportError, or a CUDA install that fails at import
        raise BackendUnavailableError(
            f"RMM domains need rmm ({exc}); install nexus-cache[rmm] or set "
            "NEXUS_DEVICE_ALLOCATOR=cupy"
        ) from exc
    return rmm


def rmm_available() -> bool:
    """True when RMM imports (then ``auto`` builds RMM domains)."""
    try:
        _import_rmm()
    except BackendUnavailableError:
        return False
    return True


def _stream_class(rmm: Any) -> Any:
    try:
        from rmm.pylibrmm.stream import Stream
    except ImportError:  # releases before pylibrmm
        from rmm._cuda.stream import Stream
    return Stream


class RmmAllocationDomain(CupyArrayDomain):
    """An RMM pool under a limiting and a statistics adaptor on one device.

    ``limit_bytes`` (the cache cap) bounds live allocations and the pool;
    None leaves both unbounded. Thread-safe: allocations and the stack
    rebuild of :meth:`release_unused` are serialized by one lock.
    """

    enforces_limit = True

    def __init__(self, cupy: Any, device_id: int, *, limit_bytes: int | None = None) -> None:
        super().__init__(cupy, device_id, limit_bytes=limit_bytes)
        self._rmm = _import_rmm()
        self._stream_cls = _stream_class(self._rmm)
        self._stack_lock = threading.Lock()
        self._pool, self._top = self._build()

    def _build(self) -> tuple[Any, Any]:
        mr = self._rmm.mr
        limit = self.limit_bytes
        with self._cp.cuda.Device(self.device_id):
            maximum = None if limit is None else -(-limit // _POOL_ALIGNMENT) * _POOL_ALIGNMENT
            # initial size 0: the cap is a ceiling, never an eager reservation
            pool = mr.PoolMemoryResource(
                mr.CudaMemoryResource(), initial_pool_size=0, maximum_pool_size=maximum
            )
            limited = pool if limit is None else mr.LimitingResourceAdaptor(pool, limit)
            return pool, mr.StatisticsResourceAdaptor(limited)

    def allocate(self, size: int) -> Any:
        cp = self._cp
        nbytes = round_allocation(size)
        with self._stack_lock:
            stream = self._stream_cls(obj=cp.cuda.get_current_stream())
            try:
                buf = self._rmm.DeviceBuffer(size=nbytes, stream=stream, mr=self._top)
            except MemoryError as exc:
                raise CapacityError(
                    f"the RMM domain of CUDA device {self.device_id} cannot allocate {nbytes} B "
                    f"({self._current_bytes()} B live, limit {self.limit_bytes} B)"
                ) from exc
        # CuPy memory that keeps the DeviceBuffer (and through it the stack) alive
        mem = cp.cuda.UnownedMemory(buf.ptr, buf.size, buf, device_id=self.device_id)
        return cp.cuda.MemoryPointer(mem, 0)

    def _current_bytes(self) -> int:
        counts = self._top.allocation_counts
        if isinstance(counts, dict):  # older RMM returned a dict
            return int(counts["current_bytes"])
        return int(counts.current_bytes)

    def physical_usage(self) -> tuple[int, int]:
        with self._stack_lock:
            used = self._current_bytes()
            held = int(self._pool.pool_size())
        return used, max(used, held)

    def release_unused(self) -> int:
        with self._stack_lock:
            if self._current_bytes():
                returned = 0  # a pool cannot shrink while anything lives in it
            else:
                returned = int(self._pool.pool_size())
                # dropping the old stack frees its pool; buffers that ever came
                # from it are gone (current bytes is 0)
                self._pool, self._top = self._build()
                self._handed_out.clear()  # nothing from the old stack lives
        self.count_release(returned)
        return returned
