"""Build the device backend a setting names (``NEXUS_DEVICE_BACKEND`` or an argument).

Thread-safe: a pure function of its argument and the environment.
"""

from __future__ import annotations

from nexus_cache.backends._choice import choose
from nexus_cache.backends.base import DeviceBackend
from nexus_cache.backends.host import HostBackend
from nexus_cache.backends.kinds import BACKEND_VARIABLE, CUDA, HOST
from nexus_cache.errors import BackendUnavailableError

__all__ = ["select_backend"]


def select_backend(name: str | None = None) -> DeviceBackend:
    """Build the backend named ``name``, or by ``NEXUS_DEVICE_BACKEND`` when None.

    ``auto`` builds the first registered backend that works (``kinds.BACKENDS``
    order: CUDA when CuPy sees a GPU, else the host). Raises
    :class:`ConfigError` for an unknown name (naming where it came from and
    the accepted values) and :class:`BackendUnavailableError` when ``cuda``
    is asked for explicitly but CuPy or a GPU is missing.
    """
    choice = choose(name, variable=BACKEND_VARIABLE, argument="backend name")
    if choice == HOST.name:
        return HostBackend()
    from nexus_cache.backends.cuda import CudaBackend

    if choice == CUDA.name:
        return CudaBackend()
    try:
        return CudaBackend()
    except BackendUnavailableError:
        return HostBackend()
