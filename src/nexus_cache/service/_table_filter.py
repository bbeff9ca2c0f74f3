"""A table read's filter on its decoded frames: masks, gathers and counts.

After the checkout (:mod:`._table_scan` plans and decodes the objects) the
filter of a :class:`~._table_scan.TableRead` runs as a mask on the domain's
array module (NumPy on the host, CuPy on CUDA), the rows are gathered and
the output columns kept: in place over the frames (:func:`filter_frames`),
as one result built once from all of them (:func:`scan_table`), or only
counted (:func:`count_table`). An object whose frame holds only row groups
that the footer's statistics prove wholly kept
(:func:`~._table_scan.needs_no_mask`) is not masked: its rows are all kept,
as those of a file whose partition values decide the filter. On a device, a
filter whose every predicate reads a fixed-width or boolean column, with
fixed-width or boolean output columns, runs as one fused pass over all the
query's objects instead (:mod:`nexus_cache.frames.fused_filter`: three
kernel launches and one wait for the device; a filtered count one launch);
any other keeps the generic mask. On the host, a query of
:data:`PARALLEL_ROWS` rows or more runs its masks and gathers on the shared
worker threads. Stateless: thread-safe for frames no other thread changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from nexus_cache._workers import run_tasks
from nexus_cache.backends import AllocationDomain
from nexus_cache.frames import DeviceFrame
from nexus_cache.frames.compact import kept_rows
from nexus_cache.frames.fused_filter import fused_count, fused_scan
from nexus_cache.frames.gather import filter_frame, gather_table, gatherable
from nexus_cache.service._table_scan import TableRead
from nexus_cache.tables import DataFile, TableFilter

__all__ = [
    "PARALLEL_ROWS",
    "FilterCounts",
    "count_table",
    "filter_frames",
    "scan_table",
]


@dataclasses.dataclass(frozen=True)
class FilterCounts:
    """Rows of the decoded objects before and after the filter."""

    rows_before: int
    rows_after: int


def filter_frames(
    frames: list[DeviceFrame],
    read: TableRead,
    domain: AllocationDomain,
    unmasked: Sequence[bool] | None = None,
) -> FilterCounts:
    """Apply ``read``'s filter to ``frames`` in place (mask on the domain's ``xp``, then
    one gather per output column into ``domain``) and keep the output columns; the
    frames replaced are released. A frame of another domain (a source-cache entry
    borrowed, not copied) is always replaced by one in ``domain``: gathered, or its
    output columns copied when every row is kept, so no result shares its buffers.
    With no frame (every file pruned), one empty frame of the output columns is added.
    ``unmasked``: per frame, True where every row is kept with no mask
    (:func:`needs_no_mask`)."""
    before = sum(f.num_rows for f in frames)
    if not frames:
        schema = read.snapshot.schema
        empty = pa.schema([schema.field(n) for n in read.output]).empty_table()
        frames.append(DeviceFrame.from_arrow(_plain_fields(empty), domain=domain))
        return FilterCounts(0, 0)
    output = list(read.output)
    filters = _frame_filters(read, unmasked)
    for i, (frame, flt) in enumerate(zip(frames, filters, strict=True)):
        kept = frame
        if flt is not None:
            kept = filter_frame(frame, flt, output, domain)
        elif frame.domain is not domain:  # every row kept, of a borrowed entry: a copy
            with frame.select(output) as selected:
                kept = selected.copy_into(domain)
        elif list(frame.column_names) != output:
            kept = frame.select(output)
        if kept is not frame:
            frames[i] = kept
            frame.release()
    return FilterCounts(before, sum(f.num_rows for f in frames))


def _frame_filters(read: TableRead, unmasked: Sequence[bool] | None) -> list[TableFilter | None]:
    """What each frame's rows must pass (None: every row does): ``unmasked[i]`` where
    frame ``i`` needs no mask (:func:`needs_no_mask`), else its file's residual."""
    filters = [_file_filter(read, file) for file in read.files]
    if unmasked is not None:
        filters = [None if skip else f for f, skip in zip(filters, unmasked, strict=True)]
    return filters


def _file_filter(read: TableRead, file: DataFile) -> TableFilter | None:
    """What of ``read``'s filter the rows of ``file`` must pass (None: every row does):
    the predicates on partition columns are decided per file, not per row."""
    from nexus_cache.tables.pruning import residual_filter

    flt = True if read.filter is None else residual_filter(read.filter, file)
    if flt is True:
        return None
    if flt is False:  # not for a kept file (pruned by partition); the whole filter then
        assert read.filter is not None
        return read.filter
    return flt


#: rows of a host query from which its masks and gathers run on the worker threads
#: (below it, handing work to a thread costs more than the second core saves)
PARALLEL_ROWS = 1 << 20


def scan_table(
    frames: Sequence[DeviceFrame],
    read: TableRead,
    domain: AllocationDomain,
    *,
    on_device: bool = False,
    unmasked: Sequence[bool] | None = None,
    own: bool = False,
) -> tuple[pa.Table | DeviceFrame, FilterCounts] | None:
    """``read``'s result from ``frames`` built once, as a host table: each frame's mask
    on the domain's ``xp``, its kept rows counted, then every output column allocated
    once and each frame's rows gathered straight into its slice
    (:func:`~nexus_cache.frames.gather.gather_table`; no per-object table, no
    concatenation, no copy after it). On the host, a query of :data:`PARALLEL_ROWS`
    rows or more runs its masks and gathers on the shared worker threads. The frames
    are read, not released. None when the output columns are not all fixed-width or
    boolean of one type in every frame (:func:`filter_frames` then). On a device the
    fused filter runs the query where it can (the same result in three launches and
    one wait: :func:`~nexus_cache.frames.fused_filter.fused_scan`).

    ``on_device``: the result is the gathered buffer of ``domain`` as a
    :class:`DeviceFrame` (no copy to the host; the caller releases it). ``unmasked``:
    per frame, True where every row is kept with no mask (:func:`needs_no_mask`).
    ``own``: the frames of ``domain`` are the caller's alone (its own decode or copy,
    shared with no cache entry) and released once the result is built: on the host,
    when every frame needs no mask, their fixed-width output columns become the
    result's buffers with no copy (``gather_table``'s ``hand_over``; a frame of
    another domain, a borrowed entry, is always copied)."""
    output = list(read.output)
    if not gatherable(frames, output):
        return None
    xp = domain.xp
    parallel = _parallel(frames, domain)
    before = sum(f.num_rows for f in frames)
    filters = _frame_filters(read, unmasked)
    with domain.scope():
        if not domain.host_memory:  # the common filter: three launches, one wait
            fused = fused_scan(frames, filters, output, domain, on_device=on_device, checked=True)
            if fused is not None:
                return fused, FilterCounts(before, fused.num_rows)
        if domain.host_memory:
            rows = _per_frame(frames, filters, domain, lambda mask: xp.nonzero(mask)[0], parallel)
        else:  # every mask first, then their rows with one wait for the device
            rows = kept_rows(_per_frame(frames, filters, domain, lambda mask: mask, False), xp)
        result: pa.Table | DeviceFrame
        if on_device:
            result = gather_table(frames, rows, output, domain, on_device=True, checked=True)
        else:
            result = gather_table(
                frames, rows, output, domain, parallel=parallel, hand_over=own, checked=True
            )
    return result, FilterCounts(before, result.num_rows)


def count_table(
    frames: Sequence[DeviceFrame],
    read: TableRead,
    domain: AllocationDomain,
    unmasked: Sequence[bool] | None = None,
) -> FilterCounts:
    """The rows of ``frames`` and those ``read``'s filter keeps, from the masks alone:
    nothing is gathered (a filtered count). On a device the fused filter counts them
    where it can (one launch, one read back). ``unmasked``: per frame, True where
    every row is kept with no mask (:func:`needs_no_mask`)."""
    xp = domain.xp
    filters = _frame_filters(read, unmasked)
    with domain.scope():
        if not domain.host_memory:  # the common filter: one launch, one read back
            fused = fused_count(frames, filters, domain)
            if fused is not None:
                return FilterCounts(sum(f.num_rows for f in frames), fused)
        kept = _per_frame(
            frames, filters, domain, lambda mask: xp.count_nonzero(mask), _parallel(frames, domain)
        )
        counted = [k for k in kept if k is not None]
        if counted and not domain.host_memory:  # one wait for the device, not one a frame
            values = iter(xp.stack(counted).get().tolist())
            kept = [None if k is None else next(values) for k in kept]
    return FilterCounts(
        sum(f.num_rows for f in frames),
        sum(f.num_rows if k is None else int(k) for f, k in zip(frames, kept, strict=True)),
    )


def _parallel(frames: Sequence[DeviceFrame], domain: AllocationDomain) -> bool:
    return domain.host_memory and sum(f.num_rows for f in frames) >= PARALLEL_ROWS


def _per_frame(
    frames: Sequence[DeviceFrame],
    filters: Sequence[TableFilter | None],
    domain: AllocationDomain,
    use: Callable[[Any], Any],
    parallel: bool,
) -> list[Any]:
    """``use(mask)`` for each frame with a filter (None where every row is kept),
    the frames' masks computed on the worker threads when ``parallel``."""
    from nexus_cache.tables import filter_mask

    xp = domain.xp
    out: list[Any] = [None] * len(frames)

    def task(i: int, frame: DeviceFrame, flt: TableFilter) -> Callable[[], None]:
        def run() -> None:
            columns = frame.columns_named(flt.columns)  # filter_mask names one missing
            out[i] = use(filter_mask(flt, columns, frame.num_rows, xp))

        return run

    tasks = []
    for i, (frame, flt) in enumerate(zip(frames, filters, strict=True)):
        if flt is not None:
            tasks.append(task(i, frame, flt))
    run_tasks(tasks, parallel=parallel)
    return out


def _plain_fields(table: pa.Table) -> pa.Table:
    """``table`` without field metadata (Iceberg field ids), as a scan returns it."""
    fields = [pa.field(f.name, f.type, f.nullable) for f in table.schema]
    return table.cast(pa.schema(fields))
