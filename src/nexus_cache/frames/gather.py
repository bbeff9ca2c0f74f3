"""Gather rows of a device frame by index, on the frame's own array module.

:func:`take_frame` builds a new frame of the rows ``indices`` names (in that
order) with the same code on NumPy (host) and CuPy (GPU): fixed-width and
boolean values and validity are indexed, dictionary indices are indexed
(the dictionary is shared), string and binary rows are copied through new
offsets. The new buffers are allocated by ``xp`` in the current allocation
scope (enter the domain's scope on CUDA). :func:`filter_frame` keeps the rows
a table filter (:mod:`nexus_cache.tables`) holds for: its mask, then the gather.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nexus_cache.frames.column import DeviceColumn
from nexus_cache.frames.frame import DeviceFrame

if TYPE_CHECKING:
    from nexus_cache.tables import TableFilter

__all__ = ["filter_frame", "take_frame"]


def filter_frame(frame: DeviceFrame, flt: TableFilter, output: Sequence[str]) -> DeviceFrame:
    """The rows of ``frame`` that satisfy ``flt``, with the ``output`` columns, as a new
    frame in the frame's domain: the mask (:func:`~nexus_cache.tables.filter_mask`) and
    the gather run on the domain's array module (NumPy on the host, CuPy on CUDA)."""
    from nexus_cache.tables import filter_mask

    domain = frame.domain
    xp = domain.xp
    with domain.scope():
        columns = {c.name: c for c in frame.columns if c.name in flt.columns}
        mask = filter_mask(flt, columns, frame.num_rows, xp)
        projected = frame.select(list(output))
        try:
            return take_frame(projected, xp.nonzero(mask)[0], xp)
        finally:
            projected.release()


def take_frame(frame: DeviceFrame, indices: Any, xp: Any) -> DeviceFrame:
    """The rows ``indices`` (an integer array of ``xp``) of ``frame`` as a new frame
    in the same domain; the original stays as it was (release it yourself)."""
    columns = [_take(column, indices, xp) for column in frame.columns]
    return DeviceFrame(
        columns,
        num_rows=int(indices.size),
        domain=frame.domain,
        metadata=dict(frame.schema.metadata or {}) or None,
    )


def _take(column: DeviceColumn, indices: Any, xp: Any) -> DeviceColumn:
    validity = None if column.validity is None else column.validity[indices]
    n = int(indices.size)
    if column.offsets is None:
        return DeviceColumn(
            column.field, n, column.data[indices], None, validity, column.dictionary
        )
    offsets = column.offsets
    starts = offsets[indices]
    lengths = offsets[indices + 1] - starts
    new_offsets = xp.zeros(n + 1, dtype=offsets.dtype)
    if n:
        xp.cumsum(lengths, out=new_offsets[1:])
    total = int(new_offsets[-1]) if n else 0
    # the output row of every output byte (CuPy's repeat takes no array of counts)
    rows = xp.searchsorted(new_offsets[1:], xp.arange(total, dtype=offsets.dtype), side="right")
    positions = xp.arange(total, dtype=offsets.dtype) - new_offsets[rows] + starts[rows]
    return DeviceColumn(column.field, n, column.data[positions], new_offsets, validity)
