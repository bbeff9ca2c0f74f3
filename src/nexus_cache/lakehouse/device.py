"""Optional read of a local cache entry into device memory through KvikIO.

The lakehouse cache itself knows only host bytes; this one function is the
optional bridge for callers that want GDS/KvikIO reads of hits. It needs
``kvikio`` and ``cupy`` and a CUDA device; without them it raises
:class:`~nexus_cache.errors.BackendUnavailableError`.
"""

from __future__ import annotations

import io
from typing import Any

from nexus_cache.errors import BackendUnavailableError
from nexus_cache.lakehouse.reader import LakehouseFile

__all__ = ["kvikio_available", "read_to_device"]


def kvikio_available() -> bool:
    """Whether KvikIO and CuPy import and a CUDA device is visible."""
    try:
        import cupy
        import kvikio  # noqa: F401
    except Exception:
        return False
    try:
        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:
        return False


def read_to_device(handle: LakehouseFile, out: Any = None) -> Any:
    """Read a *local* (hit) handle's whole entry into a CuPy ``uint8`` array.

    ``out``: a device array of at least ``handle.size`` bytes to fill; default a
    new one. Reads through the handle's own descriptor (``/proc/self/fd``), so it
    sees exactly the pinned, re-checked entry even if it was unlinked meanwhile.
    """
    if not handle.is_local:
        raise io.UnsupportedOperation("read_to_device needs a local read (a cache hit)")
    try:
        import cupy
        import kvikio
    except ImportError as exc:
        raise BackendUnavailableError(
            f"read_to_device needs kvikio and cupy ({exc}); install them, or read on the host"
        ) from exc
    size = handle.size
    buf = out if out is not None else cupy.empty(size, dtype=cupy.uint8)
    if buf.nbytes < size:
        raise ValueError(f"out has {buf.nbytes} bytes, the entry has {size}; pass a larger array")
    if size:
        with kvikio.CuFile(f"/proc/self/fd/{handle.fileno()}", "r") as f:
            done = f.read(buf[:size] if buf.nbytes > size else buf)
        if done != size:
            raise OSError(f"kvikio read {done} of {size} bytes of {handle.name}")
    return buf
