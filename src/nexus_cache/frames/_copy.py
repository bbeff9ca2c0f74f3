"""Device-to-device copies of columns into another domain.

Compact columns (every built or copied column) are packed into ONE
allocation of the target domain, each buffer at a 512-byte-aligned offset:
one pool allocation instead of one per buffer. A frame packed that way and
copied whole again (a source-cache hit of a resident frame) is laid out
exactly like its copy, so the copy is a single device-to-device memcpy of
the block. Slices of strings take the per-buffer path, which rebases their
offsets and copies only the bytes their rows use.

Between host domains a frame can also be shared instead of copied
(:func:`share_columns`): its buffers are Arrow's reference-counted memory,
which nothing writes or reuses while referenced.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from typing import Any

import numpy as np

from nexus_cache.backends import AllocationDomain, round_allocation
from nexus_cache.frames.column import DeviceColumn

__all__ = ["copy_column", "copy_columns", "copy_stream", "share_columns"]


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


def _buffers(column: DeviceColumn) -> list[Any]:
    """A compact column's buffers, in the order :func:`_rebuild` consumes them."""
    out = [b for b in (column.validity, column.data, column.offsets) if b is not None]
    return out + (_buffers(column.dictionary) if column.dictionary is not None else [])


def _rebuild(column: DeviceColumn, views: Iterator[Any]) -> DeviceColumn:
    validity = next(views) if column.validity is not None else None
    data = next(views)
    offsets = next(views) if column.offsets is not None else None
    dictionary = None if column.dictionary is None else _rebuild(column.dictionary, views)
    return DeviceColumn(column.field, column.length, data, offsets, validity, dictionary)


def _address(array: Any) -> int:
    if isinstance(array, np.ndarray):
        return int(array.__array_interface__["data"][0])
    return int(array.data.ptr)


def _packed_root(bufs: list[Any], layout: list[int], total: int, source: AllocationDomain) -> Any:
    """The one source allocation laid out exactly like ``layout``, or None."""
    if not bufs:
        return None
    root = source.root_of(bufs[0])
    if getattr(root, "dtype", None) != np.uint8 or int(root.nbytes) < total:
        return None
    base = _address(root)
    for buf, at in zip(bufs, layout, strict=True):
        if source.root_of(buf) is not root or _address(buf) - base != at:
            return None
    return root


def copy_columns(
    columns: Sequence[DeviceColumn],
    source: AllocationDomain,
    domain: AllocationDomain,
    stream: Any = None,
) -> list[DeviceColumn]:
    """``columns`` (allocated by ``source``) copied into ``domain``; on CUDA
    queued on ``stream`` (the caller synchronizes)."""
    if not all(c.compact for c in columns):
        return [copy_column(c, domain, stream) for c in columns]
    bufs = [b for c in columns for b in _buffers(c)]
    layout, total = [], 0
    for buf in bufs:
        layout.append(total)
        total += round_allocation(int(buf.nbytes))
    with ExitStack() as stack:
        stack.enter_context(domain.scope())
        if stream is not None:
            stack.enter_context(stream)
        block = domain.empty(total, np.uint8)
        views = [
            block[at : at + b.nbytes].view(b.dtype) for at, b in zip(layout, bufs, strict=True)
        ]
        root = _packed_root(bufs, layout, total, source)
        pairs = [(block, root[:total])] if root is not None else zip(views, bufs, strict=True)
        for dst, src in pairs:
            if stream is None:
                np.copyto(dst, src)
            elif src.nbytes:
                dst.data.copy_from_device_async(src.data, src.nbytes, stream)
    it = iter(views)
    return [_rebuild(c, it) for c in columns]


def share_columns(
    columns: Sequence[DeviceColumn], source: AllocationDomain, domain: AllocationDomain
) -> list[DeviceColumn] | None:
    """``columns`` (allocated by ``source``) as read-only views of the same memory,
    booked by ``domain`` (:meth:`~nexus_cache.backends.AllocationDomain.share`), or
    None where ``domain`` cannot share one of their allocations (the caller copies).
    Buffers that share an allocation share one twin of it."""
    if not all(c.compact for c in columns):
        return None
    twins: dict[int, Any] = {}
    views = []
    for buf in (b for c in columns for b in _buffers(c)):
        if not buf.nbytes:
            views.append(np.empty(buf.shape, buf.dtype))
            continue
        if not buf.flags.c_contiguous:
            return None
        root = source.root_of(buf)
        twin = twins.get(id(root))
        if twin is None:
            twin = domain.share(root)
            if twin is None:
                return None  # the twins made so far are dropped, and freed with it
            twins[id(root)] = twin
        at = _address(buf) - _address(root)
        views.append(twin.view(np.uint8)[at : at + buf.nbytes].view(buf.dtype).reshape(buf.shape))
    it = iter(views)
    return [_rebuild(c, it) for c in columns]
