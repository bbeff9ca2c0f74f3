"""The service's table reads: snapshot, pruning, partition columns and the filter.

A scan is a table read when it has a ``filter`` or an ``as_of``, or when its
source is a table: a Delta table (``_delta_log/``), an Iceberg table
(``metadata/``) or a directory with Hive ``key=value`` segments. Planning
resolves the snapshot (:func:`~nexus_cache.tables.resolve_table`), makes the
filter canonical against the table's schema (:class:`ConfigError` before a
byte is read), checks every data file against ``allowed_roots``, prunes files
by partition values and file statistics
(:func:`~nexus_cache.tables.plan_scan`; no footer is read while planning),
and plans each kept file in the lakehouse cache from the snapshot: a remote
Delta or Iceberg data file by its path and size (the table never rewrites
one), a listed object by its ETag and size, with no request per file; a
local file with one stat. A file whose size differs when it is read is a
stale plan, planned again.

Each kept object is decoded with its projected columns (the output columns
and the filter's, in the table's schema order): the file's own columns,
mapped by name (Iceberg: by field id), partition columns appended as
constant columns of the partition value's type, a column the file lacks as
nulls. The decoded-source key holds the object and these columns, never the
filter, so another filter over the same columns is a hit on the object's
whole entry. A filtered scan that finds no whole entry reads the object's
footer (:func:`choose_row_groups`) and decodes only the row groups the
filter may need, under a key that names them (all of them: the whole
entry's key); a graph's edges are always read whole. After the
checkout the filter runs as a mask on the domain's array module (NumPy on
the host, CuPy on CUDA), the rows are gathered and the output columns kept.
An object whose frame holds only row groups that the footer's statistics
prove wholly kept (:func:`needs_no_mask`) is not masked: its rows are all
kept, as those of a file whose partition values decide the filter.
On a device, a filter whose every predicate reads a fixed-width or boolean
column, with fixed-width or boolean output columns, runs as one fused pass
over all the query's objects instead (:mod:`nexus_cache.frames.fused_filter`:
three kernel launches and one wait for the device; a filtered count one
launch); any other keeps the generic mask.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache._lru import BoundedLRU
from nexus_cache._roots import check_listed
from nexus_cache._workers import run_tasks
from nexus_cache.backends import AllocationDomain
from nexus_cache.errors import ConfigError
from nexus_cache.frames import DeviceColumn, DeviceFrame
from nexus_cache.frames.column import storage_dtype
from nexus_cache.frames.compact import kept_rows
from nexus_cache.frames.fused_filter import fused_count, fused_scan
from nexus_cache.frames.gather import filter_frame, gather_table, gatherable
from nexus_cache.lakehouse import LakehouseCache, ReadDiagnostics, ReadPlan, resolve_source
from nexus_cache.service._lake import (
    OpenedObject,
    SourcePlan,
    check_regular,
    decode_object,
    open_object,
)
from nexus_cache.service.queries import Scan
from nexus_cache.tables import DataFile, ScanPlan, TableFilter, TableSnapshot, plan_scan

__all__ = [
    "PARALLEL_ROWS",
    "RowGroupChoice",
    "TableRead",
    "choose_row_groups",
    "count_table",
    "decode_table_object",
    "filter_frames",
    "is_table_read",
    "needs_no_mask",
    "plan_table",
    "scan_table",
]


@dataclasses.dataclass(frozen=True)
class TableRead:
    """One scan of a table snapshot: the filter, the pruning, the columns read.

    ``files`` are the kept data files, one per plan of the :class:`SourcePlan`
    they came with; ``columns`` the projected columns each object is decoded
    with (and cached under); ``output`` the scan's result columns.
    """

    snapshot: TableSnapshot
    filter: TableFilter | None
    pruning: ScanPlan
    files: tuple[DataFile, ...]
    columns: tuple[str, ...]
    output: tuple[str, ...]

    @property
    def filter_digest(self) -> str | None:
        return None if self.filter is None else self.filter.digest

    @property
    def decode_options(self) -> tuple[tuple[str, Any], ...]:
        """What joins the decoded-source key beyond the object and its columns. A
        table read of one Parquet object with no partition columns decodes exactly
        what a plain scan of its columns decodes (the schema is the object's own:
        nothing is added or filled), so the two share an entry: a filtered scan after
        an unfiltered one over the same columns is a source hit. Any other table read
        may add partition or null columns, so its kind joins the key."""
        snapshot = self.snapshot
        if snapshot.kind == "parquet" and len(snapshot.files) == 1:
            return ()
        return (("table", snapshot.kind),)

    @property
    def graph_identity(self) -> tuple[str, ...]:
        """What a graph built from this read depends on beyond its objects: the
        canonical filter and the snapshot version."""
        return (f"filter={self.filter_digest}", f"version={self.snapshot.version}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.snapshot.kind,
            "version": self.snapshot.version,
            "filter": None if self.filter is None else self.filter.to_json(),
            "filter_digest": self.filter_digest,
            "projected_columns": list(self.columns),
            **self.pruning.to_dict(),
        }


def is_table_read(scan: Scan, storage_options: Mapping[str, Any] | None = None) -> bool:
    """Whether ``scan`` reads a table (a filter, an ``as_of``, or a table source)."""
    from nexus_cache.tables import catalog_source

    if scan.is_table_read or catalog_source(scan.source) is not None:
        return True
    try:
        fs, path = resolve_source(
            scan.source, None, None if storage_options is None else dict(storage_options)
        )
        return path.endswith(".metadata.json") or _table_dir(fs, path)
    except Exception:  # any failure here (no credentials, no bucket): the listing reports it
        return False


def _table_dir(fs: Any, path: str) -> bool:
    """Whether directory ``path`` holds a Delta log, Iceberg metadata or Hive segments."""
    if fs is None:
        if not os.path.isdir(path):
            return False
        dirs = {n for n in os.listdir(path) if os.path.isdir(os.path.join(path, n))}
        metadata = os.path.join(path, "metadata")
        meta_names = os.listdir(metadata) if "metadata" in dirs else []
    else:
        if not fs.isdir(path):
            return False
        dirs = {
            str(e["name"]).rstrip("/").rsplit("/", 1)[-1]
            for e in fs.ls(path, detail=True)
            if e.get("type") == "directory"
        }
        metadata = path.rstrip("/") + "/metadata"
        meta_names = (
            [str(p).rsplit("/", 1)[-1] for p in fs.ls(metadata, detail=False)]
            if "metadata" in dirs
            else []
        )
    iceberg = any(n.endswith(".metadata.json") or n == "version-hint.text" for n in meta_names)
    return "_delta_log" in dirs or iceberg or any("=" in d for d in dirs)


def plan_table(
    cache: LakehouseCache,
    scan: Scan,
    storage_options: Mapping[str, Any] | None = None,
    allowed_roots: Sequence[str] | None = None,
) -> SourcePlan:
    """The lakehouse plans of the data files ``scan`` reads from its table's snapshot,
    after pruning; :class:`ConfigError` for a filter or column the table does not
    have, or a data file outside ``allowed_roots``, before any data is read."""
    from nexus_cache.tables import canonical_filter, catalog_source, resolve_table

    source = scan.source
    if allowed_roots is not None and catalog_source(source) is None:
        check_listed(source, (), allowed_roots)  # before its metadata is read
    raw = None if scan.filter is None else list(scan.filter)
    snapshot = resolve_table(
        source,
        scan.as_of,
        storage_options=storage_options,
        filter=raw,
        allowed_roots=allowed_roots,
    )
    flt = snapshot.pruned_with or canonical_filter(raw, snapshot.schema)  # the listing's
    output, columns, pruning = _shape(snapshot, flt, scan.columns, source)
    if allowed_roots is not None:  # a catalog table: its location, then its data files
        named = catalog_source(source) is not None
        check_listed(snapshot.location if named else source, snapshot.locations, allowed_roots)
    fs = snapshot.filesystem
    files = tuple(p.file for p in pruning.files)
    if fs is None:
        for file in files:
            check_regular(source, file.path)
    plans = tuple(_plan_file(cache, snapshot, f) for f in files)
    sizes = tuple(
        p.size if p.size is not None else f.size for p, f in zip(plans, files, strict=True)
    )
    read = TableRead(snapshot, flt, pruning, files, columns, output)
    return SourcePlan(source, plans, sizes, table=read)


_Shape = tuple[tuple[str, ...], tuple[str, ...], ScanPlan]


def _shape(
    snapshot: TableSnapshot,
    flt: TableFilter | None,
    wanted_columns: tuple[str, ...] | None,
    source: str,
) -> _Shape:
    """``(output columns, projected columns, pruning)`` of a read of ``snapshot``
    with ``flt`` and the scan's columns (None: all); :class:`ConfigError` for a
    column the table does not have. A pure function of them (no footer is read):
    kept in the snapshot's :attr:`~nexus_cache.tables.TableSnapshot.derived` by the
    filter (held, so its id names it alone) and the columns, so a repeated query
    over a snapshot its table keeps (a Hive listing's, a Delta version's) prunes no
    file again, and one resolved anew (a file changed) starts afresh."""
    memory = snapshot.derived
    key = ("table_read", id(flt), wanted_columns)
    found = memory.get(key)
    if found is not None and found[0] is flt:
        return found[1]  # type: ignore[no-any-return]
    schema = snapshot.schema
    output = tuple(schema.names) if wanted_columns is None else wanted_columns
    unknown = [c for c in output if schema.get_field_index(c) < 0]
    if unknown:
        raise ConfigError(
            f"Scan.columns: table {source!r} has no column {unknown[0]!r} (its columns: "
            f"{', '.join(schema.names[:20])}); name columns of the table"
        )
    wanted = set(output) | set(() if flt is None else flt.columns)
    columns = tuple(n for n in schema.names if n in wanted)
    pruning = plan_scan(snapshot, flt)  # partitions and file statistics; no footers
    shape = (output, columns, pruning)
    memory.put(key, (flt, shape))
    return shape


def _plan_file(cache: LakehouseCache, snapshot: TableSnapshot, file: DataFile) -> ReadPlan:
    """One data file's lakehouse plan, with no request for a remote one whose identity
    the snapshot gives: a Delta or Iceberg data file (immutable: path and size), or a
    listed object with its ETag. Otherwise (a local file: one stat; a listing with no
    ETag) planned as any object."""
    fs = snapshot.filesystem
    if fs is None:
        return cache.plan_known(file.path, file.size)
    if file.etag is not None or snapshot.kind in ("delta", "iceberg"):
        return cache.plan_known(file.path, file.size, etag=file.etag, fs=fs)
    return cache.plan(file.path, fs=fs)


def decode_table_object(
    cache: LakehouseCache,
    read_plan: ReadPlan,
    file: DataFile,
    read: TableRead,
    domain: AllocationDomain,
    diagnostics: list[ReadDiagnostics],
    *,
    row_groups: Sequence[int] | None = None,
    opened: OpenedObject | None = None,
    footer: pq.FileMetaData | None = None,
) -> DeviceFrame:
    """One data file's projected columns as a frame in ``domain`` (see the module doc):
    of ``row_groups`` only when given (none at all: an empty frame of those columns);
    ``opened``: the file already opened with its footer read (closed here); ``footer``:
    its footer parsed before (:func:`choose_row_groups`), not parsed again."""
    from nexus_cache.tables.pruning import file_column_names

    schema = read.snapshot.schema
    read_schema = pa.schema([schema.field(n) for n in read.columns])
    names: dict[str, str] = {}

    def pick(file_schema: pa.Schema) -> list[str]:
        names.update(file_column_names(read_schema, file_schema))
        return sorted(set(names.values()), key=file_schema.get_field_index)

    decoded = decode_object(
        cache,
        read_plan,
        None,
        domain,
        diagnostics,
        file_columns=pick,
        row_groups=row_groups,
        opened=opened,
        footer=footer,
    )
    rows = decoded.num_rows
    partition = dict(file.partition)
    # a number partition value: filled in place in the domain (no Arrow column, no copy)
    constants: dict[str, DeviceColumn] = {}
    try:
        for f in read_schema:
            if f.name not in names and f.name in partition:
                column = _constant_column(f, partition[f.name], rows, domain)
                if column is not None:
                    constants[f.name] = column
    except BaseException:
        decoded.release()
        raise
    missing = [f for f in read_schema if f.name not in names and f.name not in constants]
    fill = [
        # one value repeated in Arrow, not a Python list of ``rows`` items
        pa.repeat(pa.array([partition[f.name]], type=f.type)[0], rows)
        if f.name in partition
        else pa.nulls(rows, type=f.type)
        for f in missing
    ]
    extra = (
        DeviceFrame.from_arrow(pa.table(fill, names=[f.name for f in missing]), domain=domain)
        if fill
        else None
    )
    columns = []
    for f in read_schema:
        if f.name in names:
            column = decoded.column(names[f.name])
            if column.name != f.name:  # an Iceberg column renamed since the file was written
                column = dataclasses.replace(column, field=column.field.with_name(f.name))
        elif f.name in constants:
            column = constants[f.name]
        else:
            assert extra is not None
            column = extra.column(f.name)
        columns.append(column)
    frame = DeviceFrame(columns, num_rows=rows, domain=domain, owner=decoded.owner)
    decoded.release()
    if extra is not None:
        extra.release()
    return frame


def _constant_column(
    field: pa.Field, value: Any, rows: int, domain: AllocationDomain
) -> DeviceColumn | None:
    """``rows`` copies of a partition's integer or floating-point ``value`` as a column
    allocated in ``domain`` and filled there; None for any other type or a null."""
    if value is None or not (pa.types.is_integer(field.type) or pa.types.is_floating(field.type)):
        return None
    data = domain.empty(rows, storage_dtype(field.type))
    with domain.scope():
        data.fill(value)
    return DeviceColumn(field, rows, data)


@dataclasses.dataclass(frozen=True)
class RowGroupChoice:
    """What a filter needs of one kept object, from its footer's statistics."""

    #: the object opened to read its footer, kept open for its decode (None: the
    #: footer was known, nothing was opened)
    opened: OpenedObject | None
    total: int
    kept: tuple[int, ...]
    #: the object's parsed footer (its decode does not parse it again)
    footer: pq.FileMetaData | None = None
    #: the kept row groups whose statistics prove every row satisfies the filter
    all_true: tuple[int, ...] = ()

    @property
    def groups(self) -> tuple[int, ...] | None:
        """The row groups to decode; None: all of them (the whole object)."""
        return None if len(self.kept) == self.total else self.kept


#: parsed footers by the object's proven identity key (the same key names the
#: same bytes, as the decoded-source cache relies on): a repeated filtered scan
#: whose row-group entry is resident prunes again without opening the object
_FOOTERS: BoundedLRU[str, pq.FileMetaData] = BoundedLRU(256)


def choose_row_groups(
    cache: LakehouseCache,
    read_plan: ReadPlan,
    file: DataFile,
    read: TableRead,
    diagnostics: list[ReadDiagnostics],
) -> RowGroupChoice:
    """Keep the row groups of one kept object whose statistics (and the file's
    partition values) may satisfy ``read``'s filter, from its footer: one known
    for its identity, else read by opening the object, which then stays open for
    the decode (:func:`decode_table_object`'s ``opened``)."""
    from nexus_cache.tables.pruning import split_row_groups

    key = read_plan.key  # None: no proven identity, the bytes may change under the name
    metadata = None if key is None else _FOOTERS.get(key)
    opened = None
    if metadata is None:
        opened = open_object(cache, read_plan, diagnostics)
        metadata = opened.metadata
        if key is not None:
            _FOOTERS.put(key, metadata)
    try:
        kept, all_true = split_row_groups(metadata, read.filter, file)
    except BaseException:
        if opened is not None:
            opened.close()
        raise
    return RowGroupChoice(opened, metadata.num_row_groups, kept, metadata, all_true)


def needs_no_mask(held: tuple[int, ...] | None, choice: RowGroupChoice | None) -> bool:
    """Whether every row of an object's frame satisfies the filter without a mask:
    the frame holds row groups ``held`` (None: all of the object's) and each is one
    ``choice``'s statistics prove wholly kept. A frame of an entry holding other row
    groups (the whole object, decoded by an unfiltered scan) needs its mask; so does
    one whose footer was not read (``choice`` None)."""
    if choice is None:
        return False
    rows = range(choice.total) if held is None else held
    proven = set(choice.all_true)
    return all(i in proven for i in rows)


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
