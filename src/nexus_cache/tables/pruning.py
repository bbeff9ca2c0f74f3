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

import operator
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.types as pat

from nexus_cache._lru import BoundedLRU
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
class _Range:
    """What is known of one column within a file or row group."""

    exact: bool = False  # every row holds ``low`` (a partition value; None: all null)
    low: Any = None
    high: Any = None
    nulls: int | None = None  # None: unknown
    rows: int | None = None
    #: ``low`` and ``high`` are the exact least and greatest values (not truncated)
    exact_bounds: bool = False


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


@dataclass(frozen=True)
class _Columns:
    """What pruning needs of a filter's columns, found once per filter rather than
    once per file: their types and each type's value converter."""

    names: tuple[str, ...]
    types: Mapping[str, pa.DataType]
    canonical: Mapping[str, Callable[[Any], Any]]


def _columns(flt: TableFilter) -> _Columns:
    return _Columns(flt.columns, flt.column_types, flt.converters)


def _possible(flt: TableFilter, ranges: Mapping[str, _Range], cols: _Columns) -> bool:
    """False when no row with these column ranges can satisfy ``flt``."""
    if not ranges:
        return True  # nothing known: no proof
    types = cols.types
    return any(
        all(_maybe(p, ranges.get(p.column), types[p.column]) for p in clause)
        for clause in flt.clauses
    )


def _maybe(p: Predicate, known: _Range | None, arrow_type: pa.DataType) -> bool:
    if known is None:
        return True
    if known.exact:
        return _exact(p, known.low)
    in_list = p.op in ("in", "not in")
    has_null_value = in_list and bool(p.value) and p.value[-1] is None
    all_null = known.rows is not None and known.nulls is not None and known.nulls >= known.rows
    some_null = known.nulls is None or known.nulls > 0
    if p.op == "not in" and some_null and not has_null_value:
        return True  # a null row satisfies 'not in' a list without null
    if p.op == "in" and has_null_value and some_null:
        return True
    if all_null:
        return False
    low, high = known.low, known.high
    if low is None or high is None:
        return True
    floating = pat.is_floating(arrow_type)
    if floating:
        p = _as_compared(p, arrow_type)
    try:
        if p.op == "=":
            return bool(low <= p.value <= high)
        if p.op == "!=":
            return floating or not low == high == p.value
        if p.op == "<":
            return bool(low < p.value)
        if p.op == "<=":
            return bool(low <= p.value)
        if p.op == ">":
            return bool(high > p.value)
        if p.op == ">=":
            return bool(high >= p.value)
        values = [v for v in p.value if v is not None]
        if p.op == "in":
            return any(low <= v <= high for v in values)
        return floating or not (low == high and low in values)
    except TypeError:  # a bound of another kind than the value: no proof
        return True


def _as_compared(p: Predicate, arrow_type: pa.DataType) -> Predicate:
    """``p`` with its values as the row mask compares them: an ``in`` list of a
    float32 column rounded to float32 (``tables.mask``, as pyarrow's ``is_in``: 0.1
    reads as 0.1f); a comparison's value as it is (compared in float64)."""
    base = arrow_type.value_type if pat.is_dictionary(arrow_type) else arrow_type
    if not pat.is_float32(base) or p.op not in ("in", "not in"):
        return p

    def rounded(v: Any) -> Any:
        if v is None or abs(v) > _FLOAT32_MAX:
            return v
        return float(np.float32(v))

    return Predicate(p.column, p.op, tuple(rounded(v) for v in p.value))


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _certain(flt: TableFilter, ranges: Mapping[str, _Range], cols: _Columns) -> bool:
    """True when every row with these column ranges satisfies ``flt``: some clause
    whose every predicate is proven true (:func:`_surely`)."""
    types = cols.types
    return any(
        all(_surely(p, ranges.get(p.column), types[p.column]) for p in clause)
        for clause in flt.clauses
    )


def _provable(arrow_type: pa.DataType) -> bool:
    """Whether a column of this type has exact statistics: integers, dates,
    timestamps and booleans (never floats: their bounds ignore NaN)."""
    return (
        pat.is_integer(arrow_type)
        or pat.is_date(arrow_type)
        or pat.is_timestamp(arrow_type)
        or pat.is_boolean(arrow_type)
    )


def may_prove_all_true(flt: TableFilter, exact_columns: Sequence[str] = ()) -> bool:
    """Whether statistics could ever prove that every row of a row group satisfies
    ``flt``: some clause reads only columns of ``exact_columns`` (partition columns,
    decided per file) or of a type with exact statistics (:func:`_provable`)."""
    types, exact = flt.column_types, set(exact_columns)
    return any(
        all(p.column in exact or _provable(types[p.column]) for p in clause)
        for clause in flt.clauses
    )


def _surely(p: Predicate, known: _Range | None, arrow_type: pa.DataType) -> bool:
    """True only when every row of a column known as ``known`` satisfies ``p``."""
    if known is None:
        return False
    if known.exact:
        return _decide(p, known.low) is True
    low, high = known.low, known.high
    if (
        not known.exact_bounds
        or known.nulls != 0
        or low is None
        or high is None
        or not _provable(arrow_type)
    ):
        return False
    try:
        if p.op in ("<", "<=", ">", ">="):
            # every row within [low, high]: the farthest bound decides
            return bool(_COMPARE[p.op](high if p.op[0] == "<" else low, p.value))
        if p.op == "=":
            return bool(low == high == p.value)
        if p.op == "!=":
            return bool(p.value < low or p.value > high)
        values = [v for v in p.value if v is not None]
        if p.op == "not in":
            return not any(low <= v <= high for v in values)
        # 'in': every value of [low, high] (a few integers at most) in the list
        if high - low >= len(values):
            return False
        found = set(values)
        return all(v in found for v in range(low, high + 1))
    except TypeError:  # a bound of another kind than the value: no proof
        return False


def _exact(p: Predicate, value: Any) -> bool:
    """``p`` on a column whose every row holds ``value`` (None: null); True when
    the value cannot be compared (no proof)."""
    decided = _decide(p, value)
    return True if decided is None else decided


def _decide(p: Predicate, value: Any) -> bool | None:
    """``p`` on a column whose every row holds ``value``; None when undecided."""
    if p.op in ("in", "not in"):
        found = value in p.value
        return found if p.op == "in" else not found
    if value is None:
        return False
    try:
        return bool(_COMPARE[p.op](value, p.value))
    except TypeError:
        return None


#: each comparison operator of a canonical predicate (never ``==``)
_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
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
    known = _file_ranges(file, _columns(flt), partition=True)
    clauses: list[tuple[Predicate, ...]] = []
    for clause in flt.clauses:
        left: list[Predicate] = []
        for p in clause:
            found = known.get(p.column)
            decided = None if found is None else _decide(p, found.low)
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


def _partition_ranges(partition: tuple[tuple[str, Any], ...], cols: _Columns) -> dict[str, _Range]:
    """The exact ranges of the filter's columns among ``partition``'s values."""
    out: dict[str, _Range] = {}
    canonical = cols.canonical
    for name, value in partition:
        if name in canonical:
            typed = canonical[name](value)
            if typed is not None or value is None:
                out[name] = _Range(exact=True, low=typed)
    return out


def _file_ranges(file: DataFile, cols: _Columns, partition: bool) -> dict[str, _Range]:
    if partition:
        return _partition_ranges(file.partition, cols)
    out: dict[str, _Range] = {}
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
        out[name] = _Range(low=low, high=high, nulls=nulls.get(name), rows=file.row_count)
    return out


def prune_files(
    snapshot: TableSnapshot, flt: TableFilter | None
) -> tuple[tuple[DataFile, ...], int, int]:
    """``(kept files, pruned by partition, pruned by file statistics)``.

    Partition predicates are decided once per distinct set of partition values
    (every file of one partition gets the same answer)."""
    if flt is None:
        return snapshot.files, 0, 0
    cols = _columns(flt)
    possible = partition_test(flt)
    kept: list[DataFile] = []
    by_partition = by_statistics = 0
    for file in snapshot.files:
        if not possible(file.partition):
            by_partition += 1
        elif not _possible(flt, _file_ranges(file, cols, partition=False), cols):
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
                if _decide(p, typed) is False:
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
        self._ranges: dict[tuple[int, str], tuple[_Range | None, ...]] = {}

    def ranges(
        self, metadata: pq.FileMetaData, column: int, arrow_type: pa.DataType
    ) -> tuple[_Range | None, ...]:
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
    cols = _columns(flt)
    fixed = _file_ranges(file, cols, partition=True) if file is not None else {}
    # each filter column: its statistics per row group, or what stands for them
    per_column: list[tuple[str, _Range | None, tuple[_Range | None, ...] | None]] = []
    for name in flt.columns:
        if name in fixed:
            continue
        j = footer.index.get(names.get(name, ""))
        if j is None:
            if name not in names:  # not in this file: every row reads as null
                per_column.append((name, _Range(exact=True, low=None), None))
            continue
        per_column.append((name, None, footer.ranges(metadata, j, flt.schema.field(name).type)))
    kept, certain = [], []
    for i in every:
        ranges = dict(fixed)
        for name, whole, by_group in per_column:
            found = whole if by_group is None else by_group[i]
            if found is not None:
                ranges[name] = found
        if _possible(flt, ranges, cols):
            kept.append(i)
            if _certain(flt, ranges, cols):
                certain.append(i)
    return tuple(kept), tuple(certain)


_PARQUET_UNITS = {"MILLIS": "ms", "MICROS": "us", "NANOS": "ns"}
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _statistics(chunk: Any, arrow_type: pa.DataType, rows: int) -> _Range | None:
    stats = chunk.statistics
    if stats is None:
        return None
    nulls = int(stats.null_count) if stats.has_null_count else None
    if not stats.has_min_max:
        return _Range(nulls=nulls, rows=rows)
    # pyarrow exposes whether a bound was truncated in some versions; where it does
    # not, integer, date, timestamp and boolean bounds are exact (the only ones used
    # for a proof: see _surely)
    exact = bool(getattr(stats, "is_min_value_exact", True)) and bool(
        getattr(stats, "is_max_value_exact", True)
    )
    base = arrow_type.value_type if pat.is_dictionary(arrow_type) else arrow_type
    if pat.is_timestamp(base):
        unit = _timestamp_unit(stats)
        if unit is None:
            return _Range(nulls=nulls, rows=rows)
        low, high = (
            _rescale(int(stats.min_raw), unit, base.unit, up=False),
            _rescale(int(stats.max_raw), unit, base.unit, up=True),
        )
    else:
        low = _canonical_value(stats.min, arrow_type)
        high = _canonical_value(stats.max, arrow_type)
    return _Range(low=low, high=high, nulls=nulls, rows=rows, exact_bounds=exact)


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
