"""Comparing Arrow tables without regard to row order or string/view flavours."""

from __future__ import annotations

import pyarrow as pa


def _plain_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_dictionary(t):
        return _plain_type(t.value_type)
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    return t


def normal(table: pa.Table, columns: list[str] | None = None) -> pa.Table:
    """``table`` (its ``columns``) with plain types, rows sorted by every column."""
    if columns is not None:
        table = table.select(columns)
    fields = [pa.field(f.name, _plain_type(f.type)) for f in table.schema]
    table = table.cast(pa.schema(fields))
    if not table.num_rows:
        return table
    return table.sort_by([(name, "ascending") for name in table.column_names])


def assert_same_rows(got: pa.Table, want: pa.Table) -> None:
    assert got.column_names == want.column_names, (got.column_names, want.column_names)
    left, right = normal(got), normal(want.select(got.column_names))
    assert left.schema == right.schema, (left.schema, right.schema)
    assert left.num_rows == right.num_rows, (left.num_rows, right.num_rows)
    assert left.to_pylist() == right.to_pylist()
