"""A :class:`~nexus_cache.tables.filters.TableFilter` evaluated as a boolean mask.

The columns are held as arrays of an array module ``xp`` (NumPy on the host,
CuPy on a GPU), in the layout of a device frame's columns: ``data`` (one value
per row; timestamps and dates as their integer storage), ``offsets`` and
``data`` bytes for strings, ``data`` indices and a ``dictionary`` column for
dictionaries, and an optional ``validity`` (``True`` where the row is valid).
Only functions NumPy and CuPy share are used, so one code path serves both.
Strings compare byte-wise (UTF-8 order, as Arrow does), in blocks of rows.
Pure functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from nexus_cache.errors import ConfigError
from nexus_cache.tables.filters import Predicate, TableFilter

__all__ = ["HostColumn", "MaskColumn", "filter_mask", "host_columns"]

#: rows per block when strings are compared (bounds the temporary byte matrix)
_STRING_BLOCK_ROWS = 1 << 18


class MaskColumn(Protocol):
    """What :func:`filter_mask` reads of a column (a device frame's column has it)."""

    @property
    def type(self) -> pa.DataType: ...

    @property
    def length(self) -> int: ...

    @property
    def data(self) -> Any: ...

    @property
    def offsets(self) -> Any: ...

    @property
    def validity(self) -> Any: ...

    @property
    def dictionary(self) -> Any: ...


@dataclass(frozen=True)
class HostColumn:
    """One column's arrays in the mask layout (see the module doc)."""

    type: pa.DataType
    length: int
    data: Any
    offsets: Any = None
    validity: Any = None
    dictionary: HostColumn | None = None


def host_columns(table: pa.Table, names: Any = None, xp: Any = np) -> dict[str, HostColumn]:
    """``table``'s columns (all, or ``names``) as :class:`HostColumn` arrays of ``xp``."""
    chosen = table.column_names if names is None else list(names)
    return {name: _host_column(table.column(name).combine_chunks(), xp) for name in chosen}


def _host_column(array: pa.Array, xp: Any) -> HostColumn:
    length = len(array)
    validity = None
    if array.null_count:
        validity = xp.asarray(array.is_valid().to_numpy(zero_copy_only=False))
    arrow_type = array.type
    if pat.is_dictionary(arrow_type):
        indices = pc.fill_null(array.indices, 0).to_numpy(zero_copy_only=False)
        dictionary = _host_column(array.dictionary, xp)
        return HostColumn(arrow_type, length, xp.asarray(indices), None, validity, dictionary)
    if pat.is_string(arrow_type) or pat.is_large_string(arrow_type):
        large = array.cast(pa.large_string())
        buffers = large.buffers()
        offsets = np.frombuffer(buffers[1], dtype=np.int64)[
            large.offset : large.offset + length + 1
        ]
        data = (
            np.frombuffer(buffers[2], dtype=np.uint8)
            if buffers[2] is not None
            else np.zeros(0, np.uint8)
        )
        return HostColumn(arrow_type, length, xp.asarray(data), xp.asarray(offsets), validity)
    if pat.is_timestamp(arrow_type):
        values = pc.fill_null(array.cast(pa.int64()), 0)
    elif pat.is_date32(arrow_type):
        values = pc.fill_null(array.cast(pa.int32()), 0)
    elif array.null_count:
        values = pc.fill_null(array, False if pat.is_boolean(arrow_type) else 0)
    else:
        values = array
    return HostColumn(
        arrow_type, length, xp.asarray(values.to_numpy(zero_copy_only=False)), None, validity
    )


def filter_mask(
    flt: TableFilter, columns: Mapping[str, MaskColumn], num_rows: int, xp: Any
) -> Any:
    """The rows of ``columns`` that satisfy ``flt``: a boolean array of ``xp``.

    ``columns`` holds (at least) every column the filter reads, each of
    ``num_rows`` rows. :class:`ConfigError` when one is missing.
    """
    missing = [name for name in flt.columns if name not in columns]
    if missing:
        raise ConfigError(
            f"filter {flt.key}: the rows hold no column {missing[0]!r}; read the filter's "
            "columns with the output columns"
        )
    result = None
    for clause in flt.clauses:
        part = None
        for p in clause:  # the first predicate's array is the clause's (no ones, no copy)
            if part is None:
                part = _predicate_mask(p, columns[p.column], xp)
            else:
                part &= _predicate_mask(p, columns[p.column], xp)
        if part is None:  # an empty clause holds for every row
            part = xp.ones(num_rows, dtype=bool)
        if result is None:
            result = part
        else:
            result |= part
    return xp.zeros(num_rows, dtype=bool) if result is None else result


def _predicate_mask(p: Predicate, column: MaskColumn, xp: Any) -> Any:
    if p.op in ("in", "not in"):
        has_null = bool(p.value) and p.value[-1] is None
        values = tuple(v for v in p.value if v is not None)
        found = _values_mask(column, "in", values, xp)
        if column.validity is None:
            return found if p.op == "in" else ~found
        valid = column.validity
        if p.op == "in":
            return (valid & found) | (~valid if has_null else xp.zeros_like(valid))
        return (valid & ~found) | (xp.zeros_like(valid) if has_null else ~valid)
    found = _values_mask(column, p.op, p.value, xp)
    if column.validity is not None:
        found &= column.validity
    return found


def _values_mask(column: MaskColumn, op: str, value: Any, xp: Any) -> Any:
    """``op`` on every row's value, nulls ignored (their answer is the caller's)."""
    if column.offsets is None and column.dictionary is None:  # values, one per row
        return _number_mask(column.data, op, value, xp)
    arrow_type = column.type
    if pat.is_dictionary(arrow_type):
        in_dictionary = _values_mask(column.dictionary, op, value, xp)
        dictionary_valid = column.dictionary.validity
        if dictionary_valid is not None:
            in_dictionary = in_dictionary & dictionary_valid
        return in_dictionary[column.data]
    if pat.is_string(arrow_type) or pat.is_large_string(arrow_type):
        return _string_mask(column, op, value, xp)
    return _number_mask(column.data, op, value, xp)


def _number_mask(data: Any, op: str, value: Any, xp: Any) -> Any:
    """``op`` on a column of one value per row (numbers, booleans, temporal storage)."""
    if op == "in":
        return _in_sorted(data, value, xp)  # the list in the column's type, as is_in
    if data.dtype.kind == "f" and data.dtype.itemsize < 8:
        # a comparison in float64, as pyarrow's: 0.1 equals no float32 (NumPy would
        # round the Python float to the array's type)
        data = data.astype(np.float64)
    return _compare(data, op, value)


def _compare(data: Any, op: str, value: Any) -> Any:
    if op == "=":
        return data == value
    if op == "!=":
        return data != value
    if op == "<":
        return data < value
    if op == "<=":
        return data <= value
    if op == ">":
        return data > value
    return data >= value


def _in_sorted(data: Any, values: tuple[Any, ...], xp: Any) -> Any:
    """Rows whose value is one of ``values`` (sorted): a binary search per row."""
    if not values:
        return xp.zeros(data.shape[0], dtype=bool)
    if data.dtype == bool:
        data = data.astype(np.uint8)
        table = xp.asarray(np.array(sorted({int(v) for v in values}), dtype=np.uint8))
    elif any(isinstance(v, float) for v in values) and data.dtype.kind in "iu":
        data = data.astype(np.float64)
        table = xp.asarray(np.array(values, dtype=np.float64))
    else:
        table = xp.asarray(np.array(values, dtype=data.dtype))
    at = xp.searchsorted(table, data)
    at = xp.minimum(at, table.shape[0] - 1)
    return table[at] == data


def _string_mask(column: MaskColumn, op: str, value: Any, xp: Any) -> Any:
    """``op`` on string rows against ``value`` (one string, or the sorted tuple of
    ``in``), comparing UTF-8 bytes in blocks of rows."""
    values = [v.encode("utf-8") for v in (value if op == "in" else (value,))]
    n = column.length
    out = xp.zeros(n, dtype=bool)
    if not values or n == 0:
        return out
    width = max(len(v) for v in values) + 1
    matrix = np.full((len(values), width), -1, dtype=np.int16)
    for i, v in enumerate(values):
        matrix[i, : len(v)] = np.frombuffer(v, dtype=np.uint8)
    table = xp.asarray(matrix)
    offsets = column.offsets
    for start in range(0, n, _STRING_BLOCK_ROWS):
        stop = min(start + _STRING_BLOCK_ROWS, n)
        rows = _row_bytes(column.data, offsets[start : stop + 1], width, xp)
        if op == "in":
            out[start:stop] = _in_strings(rows, table, xp)
        else:
            sign = _lexical_sign(rows, table[0][None, :], xp)
            out[start:stop] = _compare(sign, op, 0)
    return out


def _row_bytes(data: Any, offsets: Any, width: int, xp: Any) -> Any:
    """Each row's first ``width`` bytes as int16, -1 past its end: rows x width."""
    starts = offsets[:-1].astype(np.int64)
    lengths = offsets[1:].astype(np.int64) - starts
    positions = xp.arange(width, dtype=np.int64)[None, :]
    inside = positions < lengths[:, None]
    if data.shape[0] == 0:
        return xp.full(inside.shape, -1, dtype=np.int16)
    index = xp.where(inside, starts[:, None] + positions, 0)
    return xp.where(inside, data[index].astype(np.int16), np.int16(-1))


def _lexical_sign(rows: Any, against: Any, xp: Any) -> Any:
    """-1, 0 or 1 per row: the row's bytes against ``against``'s (one row each, or
    one row for all), both padded with -1 past their ends."""
    differ = rows != against
    first = xp.argmax(differ, axis=1)
    picked = xp.arange(rows.shape[0])
    against = xp.broadcast_to(against, rows.shape)
    left = rows[picked, first].astype(np.int32)
    right = against[picked, first].astype(np.int32)
    return xp.where(differ.any(axis=1), xp.sign(left - right), 0)


def _in_strings(rows: Any, table: Any, xp: Any) -> Any:
    """Rows equal to one of ``table``'s (sorted) strings: a binary search per row."""
    count = table.shape[0]
    low = xp.zeros(rows.shape[0], dtype=np.int64)
    high = xp.full(rows.shape[0], count, dtype=np.int64)
    for _ in range(max(count, 1).bit_length()):
        mid = (low + high) // 2
        probe = xp.minimum(mid, count - 1)
        sign = _lexical_sign(rows, table[probe], xp)
        above = (sign > 0) & (mid < high)
        low = xp.where(above, mid + 1, low)
        high = xp.where(above, high, mid)
    probe = xp.minimum(low, count - 1)
    return _lexical_sign(rows, table[probe], xp) == 0
