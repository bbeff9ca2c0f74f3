"""What a column's known values prove of a filter's predicates: the ranges pruning
reads from partition values, Delta and Iceberg file statistics and Parquet
row-group statistics (:class:`ColumnRange`), whether a row within them may satisfy
a filter (:func:`may_satisfy`: when no row can, the file or row group is
skipped), and whether every row surely does (:func:`surely_satisfies`: no mask is
needed). A predicate is only proven false from a bound, and proven true only
from exact bounds of a column with exact statistics (:func:`may_prove_all_true`).
Pure functions; thread-safe.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.types as pat

from nexus_cache.tables.filters import Predicate, TableFilter

__all__ = [
    "ColumnRange",
    "FilterColumns",
    "decide_predicate",
    "exact_answer",
    "filter_columns",
    "may_prove_all_true",
    "may_satisfy",
    "surely_satisfies",
]


@dataclass(frozen=True)
class ColumnRange:
    """What is known of one column within a file or row group."""

    exact: bool = False  # every row holds ``low`` (a partition value; None: all null)
    low: Any = None
    high: Any = None
    nulls: int | None = None  # None: unknown
    rows: int | None = None
    #: ``low`` and ``high`` are the exact least and greatest values (not truncated)
    exact_bounds: bool = False


@dataclass(frozen=True)
class FilterColumns:
    """What pruning needs of a filter's columns, found once per filter rather than
    once per file: their types and each type's value converter."""

    names: tuple[str, ...]
    types: Mapping[str, pa.DataType]
    canonical: Mapping[str, Callable[[Any], Any]]


def filter_columns(flt: TableFilter) -> FilterColumns:
    return FilterColumns(flt.columns, flt.column_types, flt.converters)


def may_satisfy(flt: TableFilter, ranges: Mapping[str, ColumnRange], cols: FilterColumns) -> bool:
    """False when no row with these column ranges can satisfy ``flt``."""
    if not ranges:
        return True  # nothing known: no proof
    types = cols.types
    return any(
        all(_maybe(p, ranges.get(p.column), types[p.column]) for p in clause)
        for clause in flt.clauses
    )


def _maybe(p: Predicate, known: ColumnRange | None, arrow_type: pa.DataType) -> bool:
    if known is None:
        return True
    if known.exact:
        return exact_answer(p, known.low)
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


def surely_satisfies(
    flt: TableFilter, ranges: Mapping[str, ColumnRange], cols: FilterColumns
) -> bool:
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


def _surely(p: Predicate, known: ColumnRange | None, arrow_type: pa.DataType) -> bool:
    """True only when every row of a column known as ``known`` satisfies ``p``."""
    if known is None:
        return False
    if known.exact:
        return decide_predicate(p, known.low) is True
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


def exact_answer(p: Predicate, value: Any) -> bool:
    """``p`` on a column whose every row holds ``value`` (None: null); True when
    the value cannot be compared (no proof)."""
    decided = decide_predicate(p, value)
    return True if decided is None else decided


def decide_predicate(p: Predicate, value: Any) -> bool | None:
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
