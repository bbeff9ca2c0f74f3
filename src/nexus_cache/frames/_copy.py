"""Device-to-device copy of a column into another domain (compacting slices)."""

from __future__ import annotations

import threading
from contextlib import ExitStack
from typing import Any

import numpy as np

from nexus_cache.backends import AllocationDomain
from nexus_cache.frames.column import DeviceColumn

__all__ = ["copy_column", "copy_stream"]


class _Streams(threading.local):
    def __init__(self) -> None:
        self.by_device: dict[int, Any] = {}


_streams = _Streams()


def copy_stream(domain: AllocationDomain) -> Any:
    """This thread's non-blocking stream for copies on the domain's CUDA device
    (created once per thread and device: creating a stream per copy costs more
    than a small copy)."""
    stream = _streams.by_device.get(domain.device_id)
    if stream is None:
        cupy = domain.xp
        with cupy.cuda.Device(domain.device_id):
            stream = cupy.cuda.Stream(non_blocking=True)
        _streams.by_device[domain.device_id] = stream
    return stream


def _copy(domain: AllocationDomain, src: Any, stream: Any) -> Any:
    out = domain.empty(src.shape, src.dtype)
    if stream is None:
        np.copyto(out, src)
    elif src.nbytes:
        out.data.copy_from_device_async(src.data, src.nbytes, stream)
    return out


def copy_column(
    column: DeviceColumn, domain: AllocationDomain, stream: Any = None
) -> DeviceColumn:
    """``column`` copied into ``domain``; on CUDA queued on ``stream`` (caller syncs).

    Every allocation is made by ``domain``. String offsets of a slice are
    rebased to 0 and only the bytes the rows use are copied.
    """
    with ExitStack() as stack:
        stack.enter_context(domain.scope())
        if stream is not None:
            stack.enter_context(stream)
        validity = None if column.validity is None else _copy(domain, column.validity, stream)
        dictionary = None
        if column.dictionary is not None:
            dictionary = copy_column(column.dictionary, domain, stream)
        if column.offsets is None or column.compact:
            data = _copy(domain, column.data, stream)
            offsets = None if column.offsets is None else _copy(domain, column.offsets, stream)
        else:  # a slice: rebase the offsets, copy only the rows' bytes
            start, stop = int(column.offsets[0]), int(column.offsets[-1])
            if start == 0:
                offsets = _copy(domain, column.offsets, stream)
            else:
                offsets = domain.empty(column.offsets.shape, column.offsets.dtype)
                base = column.offsets.dtype.type(start)
                domain.xp.subtract(column.offsets, base, out=offsets)
            data = _copy(domain, column.data[start:stop], stream)
    return DeviceColumn(column.field, column.length, data, offsets, validity, dictionary)
