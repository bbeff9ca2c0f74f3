"""Device backends behind one interface: ``cuda`` (CuPy) and ``host`` (NumPy).

:func:`select_backend` picks one by name or from ``NEXUS_DEVICE_BACKEND``
(``auto``, ``cuda`` or ``host``; default ``auto``: CUDA when CuPy and a GPU
are present, the host backend otherwise). CuPy is imported only when the
CUDA backend is built.
"""

from __future__ import annotations

from nexus_cache.backends._choice import choose
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
from nexus_cache.errors import BackendUnavailableError

__all__ = [
    "ALLOCATION_ROUNDING_BYTES",
    "BACKEND_NAMES",
    "ENV_DEVICE_BACKEND",
    "AllocationDomain",
    "AllocationScope",
    "DeviceBackend",
    "DomainCounters",
    "HostBackend",
    "HostStream",
    "MemoryInfo",
    "round_allocation",
    "select_backend",
]

ENV_DEVICE_BACKEND = "NEXUS_DEVICE_BACKEND"
BACKEND_NAMES = ("auto", "cuda", "host")


def select_backend(name: str | None = None) -> DeviceBackend:
    """Build the backend named ``name``, or by ``NEXUS_DEVICE_BACKEND`` when None.

    Raises :class:`ConfigError` for an unknown name (naming where it came
    from and the accepted values) and :class:`BackendUnavailableError` when
    ``cuda`` is asked for explicitly but CuPy or a GPU is missing.
    """
    choice = choose(
        name,
        env=ENV_DEVICE_BACKEND,
        accepted=BACKEND_NAMES,
        what="a device backend",
        argument="backend name",
    )
    if choice == "host":
        return HostBackend()
    from nexus_cache.backends.cuda import CudaBackend

    if choice == "cuda":
        return CudaBackend()
    try:
        return CudaBackend()
    except BackendUnavailableError:
        return HostBackend()
