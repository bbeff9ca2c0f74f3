"""What every CuPy-backed allocation domain shares (CuPy pool and RMM domains).

CuPy's allocations are routed through the domain's :meth:`CupyArrayDomain.malloc`
inside :meth:`CupyArrayDomain.scope`, with the domain's device current: every
CuPy call a domain makes runs under ``cupy.cuda.Device(domain.device_id)``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nexus_cache.backends.base import AllocationDomain, AllocationScope
from nexus_cache.backends.kinds import CUDA
from nexus_cache.errors import LifecycleError

__all__ = ["CupyArrayDomain"]


class CupyArrayDomain(AllocationDomain):
    """What every CuPy-backed domain shares: routing CuPy's allocations through
    :meth:`malloc` inside :meth:`scope`, under the domain's device. Thread-safe."""

    kind = CUDA

    def __init__(self, cupy: Any, device_id: int, *, limit_bytes: int | None = None) -> None:
        super().__init__(device_id, limit_bytes=limit_bytes)
        self._cp = cupy
        # Base pointers this domain ever handed out. Bounded by the pool's
        # address range (pools reuse their blocks), and enough to refuse arrays
        # of CuPy's default pool or of another domain.
        self._handed_out: set[int] = set()

    @property
    def xp(self) -> Any:
        return self._cp

    @abc.abstractmethod
    def allocate(self, size: int) -> Any:
        """A ``cupy.cuda.MemoryPointer`` of at least ``size`` bytes from the
        domain's allocator (the device is current)."""

    def malloc(self, size: int) -> Any:
        """CuPy's allocator hook inside :meth:`scope`: allocate, remember, count."""
        self.require_open()
        ptr = self.allocate(size)
        self._handed_out.add(int(ptr.mem.ptr))
        self.count_allocation(int(ptr.mem.size))
        return ptr

    @contextmanager
    def scope(self) -> Iterator[AllocationScope]:
        cp = self._cp
        scope = self._push_scope()
        try:
            with cp.cuda.Device(self.device_id), cp.cuda.using_allocator(self.malloc):
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
        mem = root.data.mem
        if int(mem.ptr) not in self._handed_out:
            raise LifecycleError(
                f"array was not allocated in this domain of CUDA device {self.device_id} "
                "(CuPy's default pool or another domain); allocate it with the domain's "
                "empty() or copy_in(), or inside its scope()"
            )
        return int(mem.size)
