"""Read a whole file (e.g. a lakehouse cache hit) into device memory of a domain.

The lakehouse hands out a local file handle and knows nothing of devices;
this is the device side. The bytes land in an array the domain allocated,
so the ledger can charge them like any other cache or attempt bytes. On CUDA
the read goes through KvikIO (GPUDirect Storage where the system has it)
when ``kvikio`` imports and the handle is local, else through the pinned
staging slots (:mod:`nexus_cache.frames.staging`), reading the file straight
into pinned memory. On the host backend it is a ``readinto``.
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np

from nexus_cache.backends import AllocationDomain
from nexus_cache.frames.staging import TransferStats, open_transfer

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


def _size_of(handle: Any) -> int:
    size = getattr(handle, "size", None)
    if isinstance(size, int):
        return size
    return os.fstat(handle.fileno()).st_size


def read_to_device(
    handle: Any,
    *,
    domain: AllocationDomain,
    out: Any = None,
    use_kvikio: bool | None = None,
    stats: TransferStats | None = None,
) -> Any:
    """All bytes of ``handle`` in a ``uint8`` array allocated by ``domain``.

    ``handle``: a readable binary file with ``readinto`` and ``seek`` (a
    :class:`~nexus_cache.lakehouse.LakehouseFile`, or any local file); read
    from its start. ``out``: an array of ``domain`` of at least that many
    bytes to fill (the result is then ``out``). ``use_kvikio``: None picks
    KvikIO when available and the handle is local; True insists (raising
    :class:`io.UnsupportedOperation` for a remote handle). Not thread-safe
    per handle.
    """
    size = _size_of(handle)
    if out is None:
        out = domain.empty(size, np.uint8)
    else:
        domain.allocation_bytes(out)  # LifecycleError when not the domain's
        if int(out.nbytes) < size:
            raise ValueError(f"out has {out.nbytes} bytes, the file {size}; pass a larger array")
    local = bool(getattr(handle, "is_local", True))
    if use_kvikio and not local:
        raise io.UnsupportedOperation("a KvikIO read needs a local file (a cache hit)")
    if use_kvikio is None:
        use_kvikio = local and not domain.host_memory and kvikio_available()
    target = out[:size] if int(out.nbytes) > size else out
    if use_kvikio and size:
        _kvikio_read(handle, target, size)
        return out
    handle.seek(0)
    transfer = open_transfer(domain, timing=stats is not None)
    try:
        transfer.read_into(handle, size, target)
        transfer.finish()
    finally:
        transfer.close()
    if stats is not None:
        stats.add(transfer.stats)
    return out


def _kvikio_read(handle: Any, target: Any, size: int) -> None:
    from nexus_cache.errors import BackendUnavailableError

    try:
        import kvikio
    except ImportError as exc:
        raise BackendUnavailableError(
            f"use_kvikio=True needs kvikio ({exc}); install nexus-cache[kvikio] or pass "
            "use_kvikio=None"
        ) from exc
    # Through the handle's own descriptor: the pinned, re-checked entry even if
    # it was unlinked meanwhile.
    with kvikio.CuFile(f"/proc/self/fd/{handle.fileno()}", "r") as f:
        done = f.read(target)
    if done != size:
        raise OSError(f"kvikio read {done} of {size} bytes of {getattr(handle, 'name', handle)}")
