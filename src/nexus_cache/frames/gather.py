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

:func:`gather_table` builds a query's host result from several frames at
once: it counts each frame's kept rows, allocates every output column once
and gathers each frame's rows straight into its slice (fixed-width and
boolean columns; :func:`gatherable` says whether a set of frames qualifies).
On the host the columns are allocated in Arrow's memory pool and wrapped
without a copy; on a device they are gathered into one buffer of the domain
and copied to the host in one transfer. Nothing is concatenated or copied
again. With ``on_device=True`` the device path stops before that transfer: the
gathered buffer is the result, returned as a :class:`DeviceFrame` of the
domain (CuPy arrays on CUDA, NumPy on the host backend).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np
import pyarrow as pa

from nexus_cache._tracebacks import drop_frame_locals
from nexus_cache._workers import run_tasks
from nexus_cache.backends import AllocationDomain
from nexus_cache.errors import LifecycleError
from nexus_cache.frames._copy import copy_column
from nexus_cache.frames._host import arrow_array
from nexus_cache.frames.column import ColumnKind, DeviceColumn
from nexus_cache.frames.frame import DeviceFrame

if TYPE_CHECKING:
    from nexus_cache.tables import TableFilter

__all__ = [
    "GatherLayout",
    "filter_frame",
    "gather_into",
    "gather_table",
    "gatherable",
    "take_frame",
]


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
        columns = frame.columns_named(flt.columns)
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
    _take_into(values, indices, xp, out)
    return out


def _take_into(values: Any, indices: Any, xp: Any, out: Any) -> None:
    """``values[indices]`` (every row when ``indices`` is None) written into ``out``."""
    if indices is None:
        out[...] = values
    elif out.size:
        # NumPy buffers ``out`` unless told the indices need no check (they come
        # from nonzero or offsets, so they are in range); CuPy has no ``mode``
        if type(values) is np.ndarray:  # NumPy's own method: no dispatch on the way
            values.take(indices, axis=0, out=out, mode="clip")
        else:
            xp.take(values, indices, axis=0, out=out, **_UNCHECKED.get(xp.__name__, {}))


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


#: the layouts :func:`gather_table` writes into one preallocated column
_GATHERED = (ColumnKind.FIXED, ColumnKind.BOOL)
#: alignment of each column's section in the gathered buffer (Arrow's)
_ALIGN = 64


def gatherable(frames: Sequence[DeviceFrame], output: Sequence[str]) -> bool:
    """Whether :func:`gather_table` can build ``output`` from ``frames``: at least one
    frame, and each output column fixed-width or boolean, with one field (name,
    type, nullability, metadata) and one storage dtype in every frame."""
    if not frames:
        return False
    for name in output:
        first = frames[0].column(name)
        if first.kind not in _GATHERED:
            return False
        field, dtype = first.field, first.data.dtype
        for frame in frames[1:]:
            other = frame.column(name)
            if other.field is not field and not other.field.equals(field, check_metadata=True):
                return False
            if other.data.dtype != dtype:
                return False
    return True


@overload
def gather_table(
    frames: Sequence[DeviceFrame],
    rows: Sequence[Any | None],
    output: Sequence[str],
    domain: AllocationDomain,
    *,
    parallel: bool = ...,
    staged: bool | None = ...,
    on_device: Literal[False] = ...,
    hand_over: bool = ...,
    checked: bool = ...,
) -> pa.Table: ...


@overload
def gather_table(
    frames: Sequence[DeviceFrame],
    rows: Sequence[Any | None],
    output: Sequence[str],
    domain: AllocationDomain,
    *,
    parallel: bool = ...,
    staged: bool | None = ...,
    on_device: Literal[True],
    hand_over: bool = ...,
    checked: bool = ...,
) -> DeviceFrame: ...


def gather_table(
    frames: Sequence[DeviceFrame],
    rows: Sequence[Any | None],
    output: Sequence[str],
    domain: AllocationDomain,
    *,
    parallel: bool = False,
    staged: bool | None = None,
    on_device: bool = False,
    hand_over: bool = False,
    checked: bool = False,
) -> pa.Table | DeviceFrame:
    """The ``rows`` of each frame (an integer array of ``domain.xp``; None: every row),
    in frame order, with the ``output`` columns, as one host ``pyarrow.Table`` that
    shares no buffer with ``frames``.

    Each column is allocated once for all frames and each frame's rows are gathered
    into its slice: on the host in Arrow's memory pool (the table wraps it without
    a copy; booleans and validity are packed to bits), on a device in one buffer of
    ``domain`` copied to the host in one transfer (``staged``: that way on the host
    too; default: on a device only). ``parallel`` (host memory, not staged) runs the
    gathers on the shared worker threads. :func:`gatherable` must hold
    (:class:`ValueError` otherwise).

    ``on_device``: the same one pass into one buffer of ``domain`` (``staged`` is
    then implied), returned as a :class:`DeviceFrame` of ``domain`` whose columns
    are views of that buffer (values in the storage dtype, one ``bool`` per row for
    booleans and validity), with no copy to the host. It shares no buffer with
    ``frames``; release it when done.

    ``hand_over`` (host memory, not staged, not ``on_device``): the frames are the
    caller's alone (decoded or copied for it, in ``domain``, shared with no cache
    entry) and released once the result is built. A fixed-width output column of
    which every frame keeps every row then becomes the result's buffers as it is,
    one chunk per frame, with no copy: ``domain`` disowns each allocation behind
    it (:meth:`~nexus_cache.backends.AllocationDomain.disown`; its bytes leave the
    domain's books, its memory lives on in the result's Arrow buffers). Validity is
    packed to bits; booleans and every other column are gathered as above.

    ``checked``: the caller found :func:`gatherable` true of these frames and
    columns just now; it is not asked again.
    """
    if not checked and not gatherable(frames, output):
        raise ValueError(
            f"columns {list(output)} are not one fixed-width or boolean field in every "
            "frame; gather each frame with take_frame"
        )
    xp = domain.xp
    counts = [f.num_rows if r is None else int(r.size) for f, r in zip(frames, rows, strict=True)]
    total = sum(counts)

    def fill(layout: GatherLayout, parallel: bool) -> None:
        tasks: list[Callable[[], None]] = []
        start = 0
        for i, (count, indices) in enumerate(zip(counts, rows, strict=True)):
            for parts, (values, validity) in zip(layout.columns, layout.sections, strict=True):
                if parallel:
                    tasks.append(
                        functools.partial(
                            _gather_rows, parts[i], indices, xp, values, validity, start, count
                        )
                    )
                else:  # in this thread, in order, as run_tasks would
                    _gather_rows(parts[i], indices, xp, values, validity, start, count)
            start += count
        run_tasks(tasks, parallel=parallel)

    direct = not on_device and (domain.host_memory if staged is None else not staged)
    if not direct:
        return gather_into(frames, output, total, domain, lambda lay: fill(lay, False), on_device)
    handed = _handed_over(frames, rows, output, domain) if hand_over else []
    if handed:
        # the others gathered first: a failure there leaves every allocation booked
        rest = [name for name in output if name not in handed]
        gathered = gather_table(frames, rows, rest, domain, parallel=parallel) if rest else None
        return _hand_over(frames, output, handed, gathered, domain)
    layout = GatherLayout(frames, output, total)
    words, flags = layout.words, layout.flags
    result = pa.allocate_buffer(words.size)
    words.buffer = np.frombuffer(result, np.uint8)
    flags.buffer = np.empty(flags.size, np.uint8)
    try:
        fill(layout, parallel)
    except BaseException as exc:
        # what was allocated goes back now, though the failure's traceback lives on:
        # the frames it holds let go of their views of the buffers
        words.buffer = flags.buffer = None
        drop_frame_locals(exc)
        raise
    return layout.table(frames)


def _handed_over(
    frames: Sequence[DeviceFrame],
    rows: Sequence[Any | None],
    output: Sequence[str],
    domain: AllocationDomain,
) -> list[str]:
    """The ``output`` columns :func:`gather_table`'s ``hand_over`` gives away: where
    every frame is of ``domain`` and keeps every row, the fixed-width ones whose
    every frame holds a contiguous buffer of its own allocation in ``domain``."""
    if not domain.host_memory or any(r is not None for r in rows):
        return []
    if any(f.domain is not domain for f in frames):
        return []
    return [
        name
        for name in dict.fromkeys(output)
        if all(_own_buffer(f.column(name), domain) for f in frames)
    ]


def _own_buffer(column: DeviceColumn, domain: AllocationDomain) -> bool:
    """Whether ``column`` is fixed-width with a contiguous buffer (or none: no rows)
    that ``domain`` allocated."""
    if column.kind is not ColumnKind.FIXED:
        return False
    data = column.data
    if not data.size:
        return True
    if not data.flags.c_contiguous:
        return False
    try:
        domain.allocation_bytes(data)
    except LifecycleError:
        return False
    return True


def _hand_over(
    frames: Sequence[DeviceFrame],
    output: Sequence[str],
    handed: Sequence[str],
    gathered: pa.Table | None,
    domain: AllocationDomain,
) -> pa.Table:
    """The result table: the ``handed`` columns' buffers as they are, one chunk per
    frame, their allocations disowned by ``domain`` (a buffer it does not give away
    is copied); the other ``output`` columns from ``gathered``. Nothing here fails
    once the first allocation is disowned but Arrow wrapping a buffer."""
    disowned: set[int] = set()
    columns: dict[str, pa.ChunkedArray] = {}
    for name in handed:
        chunks = []
        for frame in frames:
            column = frame.column(name)
            if not column.length:
                continue
            data = column.data
            root = domain.root_of(data)
            if id(root) not in disowned:
                if domain.disown(root) is None:
                    data = data.copy()  # still the domain's: never aliased
                else:
                    disowned.add(id(root))
            # read-only: the memory may also be a source-cache entry's (a shared
            # decode), and Arrow then hands out immutable buffers only
            data = data.view()
            data.flags.writeable = False
            chunks.append(
                arrow_array(column.type, column.length, data, None, column.validity, None)
            )
        columns[name] = pa.chunked_array(chunks, type=frames[0].column(name).type)
    rest = iter(() if gathered is None else gathered.columns)  # the others, in order
    fields, arrays = [], []
    for name in output:
        fields.append(frames[0].column(name).field)
        arrays.append(columns[name] if name in columns else next(rest))
    return pa.Table.from_arrays(
        arrays, schema=pa.schema(fields, metadata=frames[0].schema.metadata)
    )


class GatherLayout:
    """The sections of a gathered result: each output column's values and (where a
    frame has one) validity, for ``total`` rows, in two regions of aligned sections
    (``words`` for fixed-width values, ``flags`` for booleans and validity; on a
    device one buffer holds ``words`` then ``flags``). :func:`gather_into` lays out
    its buffer with one."""

    def __init__(self, frames: Sequence[DeviceFrame], output: Sequence[str], total: int) -> None:
        self.total = total
        #: the one buffer of both regions, once :func:`gather_into` allocated it
        self.buffer: Any = None
        self.columns = [[f.column(name) for f in frames] for name in output]
        self.words, self.flags = _Region(), _Region()
        self.sections: list[tuple[_Section, _Section | None]] = []
        for parts in self.columns:
            dtype = parts[0].data.dtype
            region = self.flags if parts[0].kind is ColumnKind.BOOL else self.words
            values = region.add(total, dtype)
            nullable = any(c.validity is not None for c in parts)
            self.sections.append((values, self.flags.add(total, _BOOL) if nullable else None))

    @property
    def nbytes(self) -> int:
        """Bytes of the one buffer holding both regions."""
        return self.words.size + self.flags.size

    def offsets(self) -> list[tuple[int, int]]:
        """Each output column's byte offsets in the one buffer: its values' and its
        validity's (-1: none)."""
        words = self.words.size

        def at(section: _Section) -> int:
            return section.at + (words if section.region is self.flags else 0)

        return [(at(v), -1 if m is None else at(m)) for v, m in self.sections]

    def table(self, frames: Sequence[DeviceFrame]) -> pa.Table:
        """The host table of the filled sections (host buffers; no copy of the values)."""
        total = self.total
        arrays = [
            arrow_array(
                parts[0].type,
                total,
                values.view(0, total),
                None,
                None if validity is None else validity.view(0, total),
                None,
            )
            for parts, (values, validity) in zip(self.columns, self.sections, strict=True)
        ]
        fields = [parts[0].field for parts in self.columns]
        return pa.Table.from_arrays(
            arrays, schema=pa.schema(fields, metadata=frames[0].schema.metadata)
        )


def gather_into(
    frames: Sequence[DeviceFrame],
    output: Sequence[str],
    total: int,
    domain: AllocationDomain,
    fill: Callable[[GatherLayout], None],
    on_device: bool = False,
) -> pa.Table | DeviceFrame:
    """:func:`gather_table`'s result of ``total`` rows of the ``output`` columns of
    ``frames``, its sections written by ``fill``: one buffer of ``domain`` is laid
    out (:class:`GatherLayout`, its regions' ``buffer`` set to the two parts of it),
    ``fill(layout)`` writes every row of every section, then the buffer is the
    result (``on_device``: a :class:`DeviceFrame` of views of it) or is copied to a
    host table in one transfer. What was allocated is released on every exception.
    :func:`gatherable` must hold."""
    layout = GatherLayout(frames, output, total)
    words, flags = layout.words, layout.flags
    device: Any = domain.empty(layout.nbytes, np.uint8)
    layout.buffer = device
    words.buffer, flags.buffer = device[: words.size], device[words.size :]
    try:
        fill(layout)
        if on_device:
            return _device_frame(frames, layout.columns, layout.sections, total, domain)
        result = pa.allocate_buffer(layout.nbytes)
        if result.size:
            _to_host(device, np.frombuffer(result, np.uint8))  # the one transfer
        both = np.frombuffer(result, np.uint8)
        words.buffer, flags.buffer = both[: words.size], both[words.size :]
    except BaseException as exc:
        # what was allocated goes back now, though the failure's traceback lives on:
        # the frames it holds let go of their views of the buffers
        device = layout.buffer = words.buffer = flags.buffer = None
        drop_frame_locals(exc)
        raise
    del device
    layout.buffer = None
    return layout.table(frames)


_BOOL = np.dtype(np.bool_)


def _device_frame(
    frames: Sequence[DeviceFrame],
    columns: list[list[DeviceColumn]],
    sections: list[tuple[_Section, _Section | None]],
    total: int,
    domain: AllocationDomain,
) -> DeviceFrame:
    """The gathered sections of the domain's buffer as a frame (views, no copy)."""
    out = [
        DeviceColumn(
            parts[0].field,
            total,
            values.view(0, total),
            None,
            None if validity is None else validity.view(0, total),
        )
        for parts, (values, validity) in zip(columns, sections, strict=True)
    ]
    return DeviceFrame(out, num_rows=total, domain=domain, metadata=frames[0].schema.metadata)


def _to_host(array: Any, out: np.ndarray) -> None:
    """Copy ``array`` (NumPy or CuPy, as ``out``'s shape and dtype) into ``out``."""
    if isinstance(array, np.ndarray):
        np.copyto(out, array)
    else:
        array.get(out=out)


class _Region:
    """A byte buffer laid out in aligned sections before it is allocated."""

    def __init__(self) -> None:
        self.size = 0
        self.buffer: Any = None

    def add(self, rows: int, dtype: np.dtype[Any]) -> _Section:
        section = _Section(self, self.size, dtype)
        self.size = -(-(self.size + rows * dtype.itemsize) // _ALIGN) * _ALIGN
        return section


class _Section:
    """One column's values (or validity) in a :class:`_Region`."""

    __slots__ = ("at", "dtype", "region")

    def __init__(self, region: _Region, at: int, dtype: np.dtype[Any]) -> None:
        self.region, self.at, self.dtype = region, at, dtype

    def view(self, start: int, stop: int) -> Any:
        """Rows ``[start, stop)`` of the section, as an array of its dtype."""
        size = self.dtype.itemsize
        return self.region.buffer[self.at + start * size : self.at + stop * size].view(self.dtype)


def _gather_rows(
    column: DeviceColumn,
    indices: Any,
    xp: Any,
    values: _Section,
    validity: _Section | None,
    start: int,
    count: int,
) -> None:
    """Gather one frame's rows of one column into rows ``[start, start + count)`` of
    its output sections (validity all True where the frame has none)."""
    _take_into(column.data, indices, xp, values.view(start, start + count))
    if validity is not None:
        valid = validity.view(start, start + count)
        if column.validity is None:
            valid.fill(True)
        else:
            _take_into(column.validity, indices, xp, valid)
