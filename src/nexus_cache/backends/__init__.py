"""Device backends behind one interface: ``cuda`` (CuPy) and ``host`` (NumPy).

:mod:`nexus_cache.backends.kinds` is the registry: every backend's and
allocator's name and what each is; the rest of the package asks it (or a
built backend, or its domains) instead of spelling a name or testing for
CuPy. :func:`select_backend` picks one by name or from
``NEXUS_DEVICE_BACKEND`` (``auto``, ``cuda`` or ``host``; default ``auto``:
CUDA when CuPy and a GPU are present, the host backend otherwise).

The package is lazy: each public name loads its module on first access, so
reading the registry loads neither NumPy nor CuPy; CuPy is imported only
when the CUDA backend is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:  # the real types for the type checker; loaded lazily at run time
    from nexus_cache.backends._select import select_backend
    from nexus_cache.backends.base import (
        ALLOCATION_ROUNDING_BYTES,
        AllocationDomain,
        AllocationScope,
        DeviceBackend,
        DomainCounters,
        MemoryInfo,
        round_allocation,
    )
    from nexus_cache.backends.host import HostBackend, HostStream
    from nexus_cache.backends.kinds import (
        ALLOCATOR_NAMES,
        BACKEND_NAMES,
        BACKEND_VARIABLE,
        BACKENDS,
        ENV_DEVICE_ALLOCATOR,
        ENV_DEVICE_BACKEND,
        BackendKind,
        backend_kind,
    )

__all__ = [
    "ALLOCATION_ROUNDING_BYTES",
    "ALLOCATOR_NAMES",
    "BACKENDS",
    "BACKEND_NAMES",
    "BACKEND_VARIABLE",
    "ENV_DEVICE_ALLOCATOR",
    "ENV_DEVICE_BACKEND",
    "AllocationDomain",
    "AllocationScope",
    "BackendKind",
    "DeviceBackend",
    "DomainCounters",
    "HostBackend",
    "HostStream",
    "MemoryInfo",
    "backend_kind",
    "round_allocation",
    "select_backend",
]

# public name -> module that defines it (the names above, imported on first access)
_EXPORTS: dict[str, str] = {
    "ALLOCATION_ROUNDING_BYTES": "nexus_cache.backends.base",
    "ALLOCATOR_NAMES": "nexus_cache.backends.kinds",
    "BACKENDS": "nexus_cache.backends.kinds",
    "BACKEND_NAMES": "nexus_cache.backends.kinds",
    "BACKEND_VARIABLE": "nexus_cache.backends.kinds",
    "ENV_DEVICE_ALLOCATOR": "nexus_cache.backends.kinds",
    "ENV_DEVICE_BACKEND": "nexus_cache.backends.kinds",
    "AllocationDomain": "nexus_cache.backends.base",
    "AllocationScope": "nexus_cache.backends.base",
    "BackendKind": "nexus_cache.backends.kinds",
    "DeviceBackend": "nexus_cache.backends.base",
    "DomainCounters": "nexus_cache.backends.base",
    "HostBackend": "nexus_cache.backends.host",
    "HostStream": "nexus_cache.backends.host",
    "MemoryInfo": "nexus_cache.backends.base",
    "backend_kind": "nexus_cache.backends.kinds",
    "round_allocation": "nexus_cache.backends.base",
    "select_backend": "nexus_cache.backends._select",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
