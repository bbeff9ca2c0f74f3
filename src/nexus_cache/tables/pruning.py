"""What a filter lets a scan skip before reading: files, then row groups.

:func:`prune_files` drops the data files whose partition values (exact) or
recorded column bounds (Delta statistics, Iceberg manifest bounds) show that
no row can satisfy the filter. :func:`prune_row_groups` does the same for
the row groups of one Parquet file, from its footer's statistics, and
:func:`split_row_groups` also names the kept row groups whose statistics
prove that every row satisfies the filter (no mask is needed for them).
:func:`plan_scan` does both and counts what it skipped. A predicate is only
ever proven false, never assumed true: a missing bound keeps the file; it is
proven true only from exact statistics of an integer, date, timestamp or
boolean column with no null (never a float, whose bounds ignore NaN, nor a
string, binary or decimal, whose bounds may be truncated or rounded).
Pure functions; thread-safe.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.types as pat

from nexus_cache._lru import BoundedLRU
from nexus_cache.tables._ranges import (
    ColumnRange,
    FilterColumns,
    decide_predicate,
    filter_columns,
    may_prove_all_true,
    may_satisfy,
    surely_satisfies,
)
from nexus_cache.tables.filters import Predicate, TableFilter, _canonical_value
from nexus_cache.tables.snapshot import DataFile, TableSnapshot

__all__ = [
    "PlannedFile",
    "ScanPlan",
    "file_column_names",
    "may_prove_all_true",
    "partition_test",
    "plan_scan",
    "prune_files",
    "prune_row_groups",
    "residual_filter",
    "split_row_groups",
]


#: a partition's values -> whether a row of it may satisfy a filter
_PartitionTest = Callable[[tuple[tuple[str, Any], ...]], bool]


@dataclass(frozen=True)
class PlannedFile:
    """A data file to read, and its row groups to read (None: all)."""

    file: DataFile
    row_groups: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ScanPlan:
    """The files and row groups a filtered scan reads, and what it skipped."""

    files: tuple[PlannedFile, ...]
    objects_planned: int
    pruned_by_partition: int
    pruned_by_statistics: int
    row_groups_total: int = 0
    row_groups_pruned: int = 0

    def to_dict(self) -> dict[str, int]:
        return {
            "objects_planned": self.objects_planned,
            "objects_read": len(self.files),
            "pruned_by_partition": self.pruned_by_partition,
            "pruned_by_statistics": self.pruned_by_statistics,
            "row_groups_total": self.row_groups_total,
            "row_groups_pruned": self.row_groups_pruned,
        }


#: residual filters by the filter's key and schema (held, so its id names it alone) and
#: the partition's values: a pure function of them, so a repeated filter's files
#: (and the masks built with the same filter object) need no new one
_RESIDUALS: BoundedLRU[tuple[str, int, Any], tuple[pa.Schema, TableFilter | bool]] = BoundedLRU(
    4096
)


def residual_filter(flt: TableFilter, file: DataFile) -> TableFilter | bool:
    """What of ``flt`` is left to test row by row in ``file``, its partition values known.

    A predicate on a partition column holds for every row of the file or for
    none, so it is decided here: a clause with a false one is dropped, a true
    one leaves its clause. Returns True when every row of the file satisfies
    ``flt`` (a clause is left empty), False when none does, else the filter of
    the remaining predicates over the same schema. Remembered for the filter
    and the partition's values (the same object for a repeated filter).
    """
    name = (flt.key, id(flt.schema), file.partition)
    try:
        found = _RESIDUALS.get(name)
    except TypeError:  # an unhashable partition value: made for this file alone
        return _residual(flt, file)
    if found is not None and found[0] is flt.schema:
        return found[1]
    left = _residual(flt, file)
    _RESIDUALS.put(name, (flt.schema, left))
    return left


def _residual(flt: TableFilter, file: DataFile) -> TableFilter | bool:
    """:func:`residual_filter`, made now."""
    known = _file_ranges(file, filter_columns(flt), partition=True)
    clauses: list[tuple[Predicate, ...]] = []
    for clause in flt.clauses:
        left: list[Predicate] = []
        for p in clause:
            found = known.get(p.column)
            decided = None if found is None else decide_predicate(p, found.low)
            if decided is False:
                break
            if decided is None:
                left.append(p)
        else:
            if not left:
                return True
            clauses.append(tuple(left))
    if not clauses:
        return False
    clauses = list(dict.fromkeys(clauses))  # two clauses may leave the same predicates
    if len(clauses) == len(flt.clauses) and all(
        len(a) == len(b) for a, b in zip(clauses, flt.clauses, strict=True)
    ):
        return flt
    return TableFilter(tuple(clauses), flt.schema)


def _partition_ranges(
    partition: tuple[tuple[str, Any], ...], cols: FilterColumns
) -> dict[str, ColumnRange]:
    """The exact ranges of the filter's columns among ``partition``'s values."""
    out: dict[str, ColumnRange] = {}
    canonical = cols.canonical
    for name, value in partition:
        if name in canonical:
            typed = canonical[name](value)
            if typed is not None or value is None:
                out[name] = ColumnRange(exact=True, low=typed)
    return out


def _file_ranges(file: DataFile, cols: FilterColumns, partition: bool) -> dict[str, ColumnRange]:
    if partition:
        return _partition_ranges(file.partition, cols)
    out: dict[str, ColumnRange] = {}
    canonical = cols.canonical
    if not (file.min_values or file.max_values or file.null_counts):
        return out  # no statistics recorded
    lows, highs, nulls = dict(file.min_values), dict(file.max_values), dict(file.null_counts)
    for name in cols.names:
        convert = canonical[name]
        low = convert(lows.get(name))
        high = convert(highs.get(name))
        if low is None and high is None and name not in nulls:
            continue
        out[name] = ColumnRange(low=low, high=high, nulls=nulls.get(name), rows=file.row_count)
    return out


def prune_files(
    snapshot: TableSnapshot, flt: TableFilter | None
) -> tuple[tuple[DataFile, ...], int, int]:
    """``(kept files, pruned by partition, pruned by file statistics)``.

    Partition predicates are decided once per distinct set of partition values
    (every file of one partition gets the same answer)."""
    if flt is None:
        return snapshot.files, 0, 0
    cols = filter_columns(flt)
    possible = partition_test(flt)
    kept: list[DataFile] = []
    by_partition = by_statistics = 0
    for file in snapshot.files:
        if not possible(file.partition):
            by_partition += 1
        elif not may_satisfy(flt, _file_ranges(file, cols, partition=False), cols):
            by_statistics += 1
        else:
            kept.append(file)
    return tuple(kept), by_partition, by_statistics


#: partition tests by the filter's key and schema (held, so its id names it alone): a
#: pure function of the filter and the values, so a repeated filter decides a partition
#: once; each test remembers up to :data:`_DECIDED` partitions
_TESTS: BoundedLRU[tuple[str, int], tuple[pa.Schema, _PartitionTest]] = BoundedLRU(64)
_DECIDED = 1 << 16


def partition_test(flt: TableFilter) -> _PartitionTest:
    """Whether a partition's values (``(column, value)`` pairs, typed as the table's
    partition schema says) may satisfy ``flt``: False only when no row of that
    partition can (every row holds the partition's values, so a predicate on a
    partition column is decided exactly; one on another column proves nothing).
    The one decision of file pruning and of a Hive listing that skips
    directories; memoised by the values (unless one is unhashable), and for the
    filter (the same test for the same canonical filter on the same schema)."""
    name = (flt.key, id(flt.schema))
    found = _TESTS.get(name)
    if found is not None and found[0] is flt.schema:
        return found[1]
    test = _partition_test(flt)
    _TESTS.put(name, (flt.schema, test))
    return test


def _partition_test(flt: TableFilter) -> _PartitionTest:
    """:func:`partition_test`, made now."""
    converters = flt.converters
    # each column's predicates, with the index of the clause each belongs to
    by_column: dict[str, list[tuple[int, Predicate]]] = {}
    for i, clause in enumerate(flt.clauses):
        for p in clause:
            by_column.setdefault(p.column, []).append((i, p))
    every = (1 << len(flt.clauses)) - 1
    seen: dict[Any, bool] = {}

    def decide(partition: tuple[tuple[str, Any], ...]) -> bool:
        dead = 0  # the clauses a partition value decides false, one bit each
        for name, value in partition:
            predicates = by_column.get(name)
            if predicates is None:
                continue
            typed = converters[name](value)
            if typed is None and value is not None:
                continue  # not a value of the column's type: no proof
            for i, p in predicates:
                if decide_predicate(p, typed) is False:
                    dead |= 1 << i
        return dead != every

    def possible(partition: tuple[tuple[str, Any], ...]) -> bool:
        try:
            found = seen.get(partition)  # no KeyError raised per new partition
        except TypeError:  # an unhashable partition value: decided for this one alone
            return decide(partition)
        if found is None:
            found = decide(partition)
            if len(seen) < _DECIDED:
                seen[partition] = found
        return found

    return possible


def file_column_names(table_schema: pa.Schema, file_schema: pa.Schema) -> dict[str, str]:
    """Table column -> the file's column holding it: by Iceberg field id where both
    schemas carry one (``PARQUET:field_id``), else by name."""
    ids = {}
    for f in file_schema:
        found = (f.metadata or {}).get(b"PARQUET:field_id")
        if found is not None:
            ids[found] = f.name
    out = {}
    for f in table_schema:
        found = (f.metadata or {}).get(b"PARQUET:field_id")
        if found is not None and ids:
            if found in ids:
                out[f.name] = ids[found]
        elif file_schema.get_field_index(f.name) >= 0:
            out[f.name] = f.name
    return out


class _FooterStats:
    """What pruning reads of one parsed footer, read from it once: its Arrow
    schema, its leaf columns by path, and each column's statistics per row group
    (by the Arrow type they are read as)."""

    def __init__(self, metadata: pq.FileMetaData) -> None:
        self.arrow_schema = metadata.schema.to_arrow_schema()
        self.index = {metadata.schema.column(j).path: j for j in range(metadata.num_columns)}
        self._ranges: dict[tuple[int, str], tuple[ColumnRange | None, ...]] = {}

    def ranges(
        self, metadata: pq.FileMetaData, column: int, arrow_type: pa.DataType
    ) -> tuple[ColumnRange | None, ...]:
        """Leaf ``column``'s statistics in each row group, read as ``arrow_type``."""
        key = (column, str(arrow_type))
        found = self._ranges.get(key)
        if found is None:
            found = tuple(
                _statistics(g.column(column), arrow_type, g.num_rows)
                for g in (metadata.row_group(i) for i in range(metadata.num_row_groups))
            )
            self._ranges[key] = found
        return found


#: each live footer's statistics, by the footer object: a footer the caller keeps
#: (the service keeps one per object's proven identity) comes back as the same
#: object, so its pruning reads nothing of it again. An entry goes when its
#: footer does (a weak reference), so this keeps no footer alive.
_FOOTER_STATS: dict[int, tuple[weakref.ref[pq.FileMetaData], _FooterStats]] = {}
# reentrant: a footer freed by the garbage collector while it is held runs `forget`
_FOOTER_STATS_LOCK = threading.RLock()


def _footer_stats(metadata: pq.FileMetaData) -> _FooterStats:
    key = id(metadata)
    with _FOOTER_STATS_LOCK:
        found = _FOOTER_STATS.get(key)
        if found is not None and found[0]() is metadata:
            return found[1]
    made = _FooterStats(metadata)

    def forget(ref: weakref.ref[pq.FileMetaData], key: int = key) -> None:
        with _FOOTER_STATS_LOCK:
            if key in _FOOTER_STATS and _FOOTER_STATS[key][0] is ref:
                del _FOOTER_STATS[key]

    with _FOOTER_STATS_LOCK:
        _FOOTER_STATS[key] = (weakref.ref(metadata, forget), made)
    return made


def prune_row_groups(
    metadata: pq.FileMetaData,
    flt: TableFilter | None,
    file: DataFile | None = None,
) -> tuple[int, ...]:
    """The row groups of a file (its footer ``metadata``) that may hold a row
    satisfying ``flt``; ``file``'s partition values count as exact columns."""
    return split_row_groups(metadata, flt, file)[0]


def split_row_groups(
    metadata: pq.FileMetaData,
    flt: TableFilter | None,
    file: DataFile | None = None,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(kept, all true)``: the row groups of a file (its footer ``metadata``) that
    may hold a row satisfying ``flt`` (:func:`prune_row_groups`), and those of them
    whose every row provably does (from exact statistics and ``file``'s partition
    values; see the module doc). Without a filter every row group is both."""
    every = tuple(range(metadata.num_row_groups))
    if flt is None:
        return every, every
    footer = _footer_stats(metadata)
    names = file_column_names(flt.schema, footer.arrow_schema)
    cols = filter_columns(flt)
    fixed = _file_ranges(file, cols, partition=True) if file is not None else {}
    # each filter column: its statistics per row group, or what stands for them
    per_column: list[tuple[str, ColumnRange | None, tuple[ColumnRange | None, ...] | None]] = []
    for name in flt.columns:
        if name in fixed:
            continue
        j = footer.index.get(names.get(name, ""))
        if j is None:
            if name not in names:  # not in this file: every row reads as null
                per_column.append((name, ColumnRange(exact=True, low=None), None))
            continue
        per_column.append((name, None, footer.ranges(metadata, j, flt.schema.field(name).type)))
    kept, certain = [], []
    for i in every:
        ranges = dict(fixed)
        for name, whole, by_group in per_column:
            found = whole if by_group is None else by_group[i]
            if found is not None:
                ranges[name] = found
        if may_satisfy(flt, ranges, cols):
            kept.append(i)
            if surely_satisfies(flt, ranges, cols):
                certain.append(i)
    return tuple(kept), tuple(certain)


_PARQUET_UNITS = {"MILLIS": "ms", "MICROS": "us", "NANOS": "ns"}
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _statistics(chunk: Any, arrow_type: pa.DataType, rows: int) -> ColumnRange | None:
    stats = chunk.statistics
    if stats is None:
        return None
    nulls = int(stats.null_count) if stats.has_null_count else None
    if not stats.has_min_max:
        return ColumnRange(nulls=nulls, rows=rows)
    # pyarrow exposes whether a bound was truncated in some versions; where it does
    # not, integer, date, timestamp and boolean bounds are exact (the only ones used
    # for a proof: see _ranges.surely_satisfies)
    exact = bool(getattr(stats, "is_min_value_exact", True)) and bool(
        getattr(stats, "is_max_value_exact", True)
    )
    base = arrow_type.value_type if pat.is_dictionary(arrow_type) else arrow_type
    if pat.is_timestamp(base):
        unit = _timestamp_unit(stats)
        if unit is None:
            return ColumnRange(nulls=nulls, rows=rows)
        low, high = (
            _rescale(int(stats.min_raw), unit, base.unit, up=False),
            _rescale(int(stats.max_raw), unit, base.unit, up=True),
        )
    else:
        low = _canonical_value(stats.min, arrow_type)
        high = _canonical_value(stats.max, arrow_type)
    return ColumnRange(low=low, high=high, nulls=nulls, rows=rows, exact_bounds=exact)


def _timestamp_unit(stats: Any) -> str | None:
    """The unit of a timestamp column chunk's raw statistics (None: INT96, unknown)."""
    logical = str(stats.logical_type).lower()
    for word, unit in _PARQUET_UNITS.items():
        if f"timeunit={word.lower()}" in logical:
            return unit
    return None


def _rescale(value: int, unit: str, to: str, up: bool) -> int:
    src, dst = _PER_SECOND[unit], _PER_SECOND[to]
    if dst >= src:
        return value * (dst // src)
    step = src // dst
    return -((-value) // step) if up else value // step


def plan_scan(
    snapshot: TableSnapshot,
    flt: TableFilter | None,
    footer: Callable[[DataFile], pq.FileMetaData] | None = None,
) -> ScanPlan:
    """The files of ``snapshot`` that ``flt`` may need, and, when ``footer`` reads
    a file's Parquet footer, the row groups of each that it may need (a file
    whose every row group is pruned is dropped too)."""
    kept, by_partition, by_statistics = prune_files(snapshot, flt)
    planned = []
    total = pruned = 0
    for file in kept:
        if footer is None or flt is None:
            planned.append(PlannedFile(file))
            continue
        metadata = footer(file)
        groups = prune_row_groups(metadata, flt, file)
        total += metadata.num_row_groups
        pruned += metadata.num_row_groups - len(groups)
        if groups:
            planned.append(PlannedFile(file, groups))
    return ScanPlan(
        files=tuple(planned),
        objects_planned=len(snapshot.files) + snapshot.partitions_skipped,
        pruned_by_partition=by_partition + snapshot.partitions_skipped,
        pruned_by_statistics=by_statistics,
        row_groups_total=total,
        row_groups_pruned=pruned,
    )
