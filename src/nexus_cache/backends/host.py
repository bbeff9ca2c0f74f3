"""Host backend: NumPy arrays on simulated devices of a configurable size.

Not a mock: it keeps the same books a CUDA memory pool keeps (512-byte
rounding, freed blocks held until released, device free memory that moves
only when blocks go back), so the cache logic CI runs is the logic the GPU
runs. The simulated device total is fixed by configuration, never by the
machine, so tests are deterministic.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import numpy as np
import pyarrow as pa

from nexus_cache._env import read
from nexus_cache.backends.base import (
    AllocationDomain,
    AllocationScope,
    DeviceBackend,
    MemoryInfo,
    round_allocation,
)
from nexus_cache.backends.kinds import (
    HOST,
    HOST_COUNT_VARIABLE,
    HOST_TOTAL_VARIABLE,
)
from nexus_cache.errors import CapacityError, ConfigError, LifecycleError

__all__ = [
    "DEFAULT_HOST_DEVICE_TOTAL_BYTES",
    "ENV_HOST_DEVICE_COUNT",
    "ENV_HOST_DEVICE_TOTAL_BYTES",
    "HostAllocationDomain",
    "HostBackend",
    "HostStream",
]

ENV_HOST_DEVICE_TOTAL_BYTES = HOST_TOTAL_VARIABLE.name
ENV_HOST_DEVICE_COUNT = HOST_COUNT_VARIABLE.name
DEFAULT_HOST_DEVICE_TOTAL_BYTES = int(read(HOST_TOTAL_VARIABLE, {}))


class HostStream:
    """Stand-in for a CUDA stream: host work is already complete when it returns."""

    def synchronize(self) -> None:
        return None


def _total_from_env() -> int:
    return int(read(HOST_TOTAL_VARIABLE))


def _count_from_env() -> int:
    return int(read(HOST_COUNT_VARIABLE))


class HostBackend(DeviceBackend):
    """NumPy backend over ``device_count`` simulated devices. Thread-safe.

    ``device_total_bytes`` defaults to ``NEXUS_HOST_DEVICE_TOTAL_BYTES`` or
    16 GiB, ``device_count`` to ``NEXUS_HOST_DEVICE_COUNT`` or 1. Allocations
    beyond a device's total raise :class:`CapacityError`, as a GPU would raise
    out-of-memory.
    """

    kind = HOST

    def __init__(
        self, device_total_bytes: int | None = None, device_count: int | None = None
    ) -> None:
        if device_total_bytes is None:
            device_total_bytes = _total_from_env()
        if device_count is None:
            device_count = _count_from_env()
        if (
            isinstance(device_total_bytes, bool)
            or not isinstance(device_total_bytes, int)
            or device_total_bytes <= 0
        ):
            raise ConfigError(
                f"device_total_bytes={device_total_bytes!r} is not a device size; "
                "accepted: a positive int"
            )
        if isinstance(device_count, bool) or not isinstance(device_count, int) or device_count < 1:
            raise ConfigError(f"device_count={device_count!r}; accepted: an int >= 1")
        self._total = device_total_bytes
        self._lock = threading.Lock()
        self._held = [0] * device_count

    @property
    def xp(self) -> Any:
        return np

    @property
    def sparse(self) -> Any:
        import scipy.sparse

        return scipy.sparse

    def device_count(self) -> int:
        return len(self._held)

    def mem_info(self, device_id: int) -> MemoryInfo:
        self.check_device(device_id)
        with self._lock:
            return MemoryInfo(self._total - self._held[device_id], self._total)

    def create_domain(
        self, device_id: int, *, limit_bytes: int | None = None
    ) -> HostAllocationDomain:
        self.check_device(device_id)
        return HostAllocationDomain(self, device_id, limit_bytes=limit_bytes)

    def device_scope(self, device_id: int) -> AbstractContextManager[None]:
        self.check_device(device_id)
        return nullcontext()  # NumPy work has no current device

    def synchronize(self, device_id: int, streams: Iterable[Any] = ()) -> None:
        self.check_device(device_id)
        for stream in streams:
            stream.synchronize()

    def take(self, device_id: int, nbytes: int) -> None:
        """Hold ``nbytes`` of the simulated device (a domain growing); CapacityError past it."""
        with self._lock:
            held = self._held[device_id]
            if held + nbytes > self._total:
                raise CapacityError(
                    f"host device {device_id} is out of memory: allocating {nbytes} B "
                    f"with {held} B held of {self._total} B; raise "
                    f"{ENV_HOST_DEVICE_TOTAL_BYTES} or free cache entries"
                )
            self._held[device_id] = held + nbytes

    def give_back(self, device_id: int, nbytes: int) -> None:
        """Return ``nbytes`` a domain held to the simulated device's free memory."""
        with self._lock:
            self._held[device_id] -= nbytes


def _fresh_bytes(size: int) -> np.ndarray:
    """``size`` writable bytes from Arrow's memory pool, as a NumPy array that owns them
    (they go back to the pool when the array and every view of it die).

    Not ``np.empty``: a block of this size comes from the C allocator's ``mmap`` (or a
    heap it trims back after each free), so every page of every new block faulted on
    its first write, about as long as copying the bytes in. Arrow's pool keeps freed
    pages mapped for the next block."""
    return np.frombuffer(pa.allocate_buffer(size), np.uint8)


class HostAllocationDomain(AllocationDomain):
    """Tracking allocator for NumPy buffers of one simulated device. Thread-safe.

    ``limit_bytes`` is recorded, not enforced: like the CuPy pool domain, the
    host domain leaves the cap to the ledger (only RMM domains add a physical
    backstop), and only the simulated device's total bounds allocations.

    Every allocation is one rounded ``uint8`` buffer; arrays handed out are
    views of it, so the buffer dies (and its bytes count as freed) only when
    the last view dies.
    """

    kind = HOST

    def __init__(
        self, backend: HostBackend, device_id: int, *, limit_bytes: int | None = None
    ) -> None:
        super().__init__(device_id, limit_bytes=limit_bytes)
        self._backend = backend
        # Reentrant: a buffer finalizer can fire in a thread that holds the lock.
        self._lock = threading.RLock()
        #: each live allocation's root array (weakly), rounded size and finalizer
        self._live: dict[int, tuple[weakref.ref[np.ndarray], int, weakref.finalize]] = {}
        self._used = 0
        self._cached = 0

    @property
    def xp(self) -> Any:
        return np

    @contextmanager
    def scope(self) -> Iterator[AllocationScope]:
        scope = self._push_scope()
        try:
            yield scope
        finally:
            self._pop_scope(scope)

    def empty(self, shape: int | tuple[int, ...], dtype: Any) -> np.ndarray:
        dt = np.dtype(dtype)
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = math.prod(dims) * dt.itemsize
        if nbytes == 0:
            return np.empty(dims, dt)
        size = round_allocation(nbytes)
        with self._lock:
            buf = self._book(size, _fresh_bytes)
        return buf[:nbytes].view(dt).reshape(dims)

    def adopt(self, array: Any) -> np.ndarray | None:
        """``array`` booked as an allocation of this domain, as :meth:`empty` books
        one of its size (rounded), with no copy; None unless it is a writable,
        C-contiguous, non-empty NumPy array that is its own root (no NumPy array
        below it: e.g. a view of a buffer Arrow decoded), not booked already. Its
        bytes count as freed when it and every view of it are gone."""
        if (
            not isinstance(array, np.ndarray)
            or not array.nbytes
            or not array.flags.writeable
            or not array.flags.c_contiguous
            or isinstance(array.base, np.ndarray)
        ):
            return None
        with self._lock:
            known = self._live.get(id(array))
            if known is not None and known[0]() is array:
                return None
            return self._book(round_allocation(int(array.nbytes)), lambda _size: array)

    def disown(self, array: Any) -> np.ndarray | None:
        """``array``, a live allocation's root, off the books with no copy: its bytes
        leave ``used`` and go back to the simulated device (not to the freed blocks
        kept for reuse), and its memory, Arrow's, lives on as long as anything
        references it. None for anything else (a view, an array not booked here)."""
        if not isinstance(array, np.ndarray):
            return None
        with self._lock:
            known = self._live.get(id(array))
            if known is None or known[0]() is not array:
                return None
            del self._live[id(array)]
            _ref, size, fin = known
            fin.detach()  # its death frees nothing of this domain now
            self._used -= size
            self._backend.give_back(self.device_id, size)
        return array

    def share(self, array: Any) -> np.ndarray | None:
        """A read-only twin of ``array`` over the same Arrow buffer, booked here as
        :meth:`adopt` books one (rounded), with no copy; None unless ``array`` is a
        non-empty, C-contiguous, writable NumPy array directly over a ``pyarrow.Buffer``
        (what :meth:`empty` allocates and what Arrow decodes). The twin holds the
        buffer, not ``array``: each lives, and is counted freed, on its own."""
        if (
            not isinstance(array, np.ndarray)
            or not array.nbytes
            or not array.flags.c_contiguous
            or not array.flags.writeable  # not a file's mapped pages, say
            or not isinstance(array.base, pa.Buffer)
        ):
            return None
        buffer = array.base
        offset = int(array.__array_interface__["data"][0]) - buffer.address
        twin = np.ndarray(array.shape, array.dtype, buffer=buffer, offset=offset)
        twin.flags.writeable = False
        with self._lock:
            return self._book(round_allocation(int(array.nbytes)), lambda _size: twin)

    def _book(self, size: int, allocate: Any) -> np.ndarray:
        """Book ``size`` bytes and the array ``allocate(size)`` gives for them (under
        the lock); its finalizer frees them."""
        self.require_open()
        if self._cached >= size:
            self._cached -= size  # reuse freed blocks, as a pool would
        else:
            self._backend.take(self.device_id, size)
        try:
            buf = allocate(size)
        except BaseException:
            self._cached += size
            raise
        self._used += size
        fin = weakref.finalize(buf, self._on_free, id(buf), size)
        fin.atexit = False
        self._live[id(buf)] = (weakref.ref(buf), size, fin)
        self.count_allocation(size)
        return buf

    def copy_in(self, array: Any) -> np.ndarray:
        src = np.asarray(array)
        out = self.empty(src.shape, src.dtype)
        np.copyto(out, src)
        return out

    def root_of(self, array: Any) -> Any:
        root = array
        while isinstance(getattr(root, "base", None), np.ndarray):
            root = root.base
        return root

    def allocation_bytes(self, array: Any) -> int:
        root = self.root_of(array)
        with self._lock:
            record = self._live.get(id(root))
        if record is None or record[0]() is not root:
            raise LifecycleError(
                f"array is not allocated in the cache domain of host device {self.device_id}; "
                "allocate it with the domain's empty() or copy_in()"
            )
        return record[1]

    def physical_usage(self) -> tuple[int, int]:
        with self._lock:
            return self._used, self._used + self._cached

    def release_unused(self) -> int:
        with self._lock:
            nbytes, self._cached = self._cached, 0
            self._backend.give_back(self.device_id, nbytes)
        self.count_release(nbytes)
        return nbytes

    def _on_free(self, key: int, size: int) -> None:
        with self._lock:
            self._live.pop(key, None)
            self._used -= size
            self._cached += size
