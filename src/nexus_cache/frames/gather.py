"""Gather rows of a device frame by index, on the frame's own array module.

:func:`take_frame` builds a new frame of the rows ``indices`` names (in that
order) with the same code on NumPy (host) and CuPy (GPU): fixed-width and
boolean values and validity are taken (``xp.take`` into buffers the target
domain allocates), dictionary indices are taken (the dictionary is shared
within a domain, copied into another), string and binary rows are copied
through new offsets. :func:`filter_frame` keeps the rows a table filter
(:mod:`nexus_cache.tables`) holds for: its mask, then one gather per column.
Both may read a frame of one domain (a pinned cache entry) and build the new
frame in another (the query's), so the result shares no buffer with the
frame it was read from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nexus_cache.backends import AllocationDomain
from nexus_cache.frames._copy import copy_column
from nexus_cache.frames.column import DeviceColumn
from nexus_cache.frames.frame import DeviceFrame

if TYPE_CHECKING:
    from nexus_cache.tables import TableFilter

__all__ = ["filter_frame", "take_frame"]


def filter_frame(
    frame: DeviceFrame,
    flt: TableFilter,
    output: Sequence[str],
    domain: AllocationDomain | None = None,
) -> DeviceFrame:
    """The rows of ``frame`` that satisfy ``flt``, with the ``output`` columns, as a new
    frame in ``domain`` (default: the frame's own; same device): the mask
    (:func:`~nexus_cache.tables.filter_mask`) and the gather run on the domain's array
    module (NumPy on the host, CuPy on CUDA), the new buffers allocated by ``domain``."""
    from nexus_cache.tables import filter_mask

    target = frame.domain if domain is None else domain
    xp = target.xp
    with target.scope():
        columns = {c.name: c for c in frame.columns if c.name in flt.columns}
        mask = filter_mask(flt, columns, frame.num_rows, xp)
        indices = xp.nonzero(mask)[0]
        del mask
        projected = frame.select(list(output))
        try:
            return take_frame(projected, indices, xp, domain=target)
        finally:
            projected.release()


def take_frame(
    frame: DeviceFrame, indices: Any, xp: Any, domain: AllocationDomain | None = None
) -> DeviceFrame:
    """The rows ``indices`` (an integer array of ``xp``) of ``frame`` as a new frame
    in ``domain`` (default: the frame's own; same device), sharing no buffer with
    ``frame`` outside its own domain; the original stays as it was (release it)."""
    target = frame.domain if domain is None else domain
    with target.scope():
        columns = [_take(c, indices, xp, target, frame.domain) for c in frame.columns]
    return DeviceFrame(
        columns,
        num_rows=int(indices.size),
        domain=target,
        metadata=dict(frame.schema.metadata or {}) or None,
    )


def _gather(values: Any, indices: Any, xp: Any, domain: AllocationDomain) -> Any:
    """``values[indices]`` into a buffer ``domain`` allocates."""
    out = domain.empty((int(indices.size), *values.shape[1:]), values.dtype)
    if out.size:
        # NumPy buffers ``out`` unless told the indices need no check (they come
        # from nonzero or offsets, so they are in range); CuPy has no ``mode``
        xp.take(values, indices, axis=0, out=out, **_UNCHECKED.get(xp.__name__, {}))
    return out


#: NumPy's ``take`` into ``out`` without the buffered bounds check
_UNCHECKED: dict[str, dict[str, str]] = {"numpy": {"mode": "clip"}}


def _take(
    column: DeviceColumn,
    indices: Any,
    xp: Any,
    domain: AllocationDomain,
    source: AllocationDomain,
) -> DeviceColumn:
    validity = None if column.validity is None else _gather(column.validity, indices, xp, domain)
    n = int(indices.size)
    if column.offsets is None:
        dictionary = column.dictionary
        if dictionary is not None and domain is not source:
            dictionary = copy_column(dictionary, domain)  # no buffer of another domain
        data = _gather(column.data, indices, xp, domain)
        return DeviceColumn(column.field, n, data, None, validity, dictionary)
    offsets = column.offsets
    starts = offsets[indices]
    lengths = offsets[indices + 1] - starts
    new_offsets = domain.empty(n + 1, offsets.dtype)
    new_offsets[:1] = 0
    if n:
        xp.cumsum(lengths, out=new_offsets[1:])
    total = int(new_offsets[-1]) if n else 0
    # the output row of every output byte (CuPy's repeat takes no array of counts)
    rows = xp.searchsorted(new_offsets[1:], xp.arange(total, dtype=offsets.dtype), side="right")
    positions = xp.arange(total, dtype=offsets.dtype) - new_offsets[rows] + starts[rows]
    data = _gather(column.data, positions, xp, domain)
    return DeviceColumn(column.field, n, data, new_offsets, validity)
