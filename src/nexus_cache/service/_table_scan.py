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
entry's key); a graph's edges are always read whole. An object whose frame
holds only row groups that the footer's statistics prove wholly kept
(:func:`needs_no_mask`) needs no mask. After the checkout the filter runs on
the decoded frames (:mod:`._table_filter`). Thread-safe: its one state,
the footers parsed (by the object's proven identity), is a bounded,
thread-safe map.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache._lru import BoundedLRU
from nexus_cache._roots import check_listed
from nexus_cache.backends import AllocationDomain
from nexus_cache.errors import ConfigError
from nexus_cache.frames import DeviceColumn, DeviceFrame
from nexus_cache.frames.column import storage_dtype
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
    "RowGroupChoice",
    "TableRead",
    "choose_row_groups",
    "decode_table_object",
    "is_table_read",
    "needs_no_mask",
    "plan_table",
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
        if fs is not None and not path.strip("/"):
            # no bucket (s3://): no table; with credentials set, asking would list
            # the account's buckets first (seconds, or a network timeout)
            return False
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
    ETag) planned as any object. A local data file that does not exist is refused
    naming the table and its version."""
    fs = snapshot.filesystem
    if fs is None:
        try:
            return cache.plan_known(file.path, file.size)
        except FileNotFoundError as exc:
            raise snapshot.missing_file(file.path) from exc
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
