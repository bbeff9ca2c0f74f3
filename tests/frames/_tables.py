"""Hypothesis strategies for Arrow tables of every type a device frame holds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

INTS = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]
UINTS = [pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
FLOATS = [pa.float16(), pa.float32(), pa.float64()]
# temporal types and the integer type their values are drawn as
TEMPORAL = [
    (pa.date32(), pa.int32()),
    (pa.date64(), pa.int64()),
    (pa.time32("s"), pa.int32()),
    (pa.time32("ms"), pa.int32()),
    (pa.time64("us"), pa.int64()),
    (pa.time64("ns"), pa.int64()),
    (pa.timestamp("s"), pa.int64()),
    (pa.timestamp("ms", tz="UTC"), pa.int64()),
    (pa.timestamp("us", tz="Europe/Paris"), pa.int64()),
    (pa.timestamp("ns"), pa.int64()),
    (pa.duration("us"), pa.int64()),
]
BINARY = [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()]
INDEX_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]
KINDS = ["int", "uint", "float", "bool", "temporal", "binary", "dictionary"]


def _mask(draw: Any, n: int, nulls: bool) -> np.ndarray | None:
    if not nulls:
        return None
    return draw(hnp.arrays(np.bool_, n))  # True = null


def _numbers(draw: Any, arrow_type: pa.DataType, n: int) -> np.ndarray:
    dtype = np.dtype(arrow_type.to_pandas_dtype())
    if dtype.kind == "f":
        elements = st.floats(width=dtype.itemsize * 8, allow_nan=False)
        return draw(hnp.arrays(dtype, n, elements=elements))
    return draw(hnp.arrays(dtype, n))


def _valid_time(arrow_type: pa.DataType, values: np.ndarray) -> np.ndarray:
    # times of day must lie within one day to be valid Arrow values
    per_day = {"s": 86_400, "ms": 86_400_000, "us": 86_400_000_000, "ns": 86_400_000_000_000}
    if pa.types.is_time(arrow_type):
        return np.abs(values) % per_day[arrow_type.unit]
    return values


@st.composite
def arrays(draw: Any, n: int, kind: str | None = None, parquet: bool = False) -> pa.Array:
    """One Arrow array of ``n`` rows of a random supported type, with nulls or not.

    ``parquet``: keep temporal values within what Parquet can store (its
    writer converts seconds to milliseconds and date64 to days).
    """
    kind = kind or draw(st.sampled_from(KINDS))
    nulls = draw(st.booleans())
    mask = _mask(draw, n, nulls)
    if kind in ("int", "uint", "float"):
        arrow_type = draw(st.sampled_from({"int": INTS, "uint": UINTS, "float": FLOATS}[kind]))
        return pa.array(_numbers(draw, arrow_type, n), type=arrow_type, mask=mask)
    if kind == "temporal":
        arrow_type, storage = draw(st.sampled_from(TEMPORAL))
        values = _valid_time(arrow_type, _numbers(draw, storage, n))
        if parquet and values.dtype == np.int64:
            values = values % (1 << 32)
            if arrow_type == pa.date64():
                values = values % 100_000 * 86_400_000
        return pa.array(values, type=storage, mask=mask).view(arrow_type)
    if kind == "bool":
        values = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        return pa.array(values, type=pa.bool_(), mask=mask)
    if kind == "binary":
        arrow_type = draw(st.sampled_from(BINARY))
        text = pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
        element = st.text(max_size=12) if text else st.binary(max_size=12)
        values = draw(st.lists(element, min_size=n, max_size=n))
        return pa.array(values, type=arrow_type, mask=mask)
    # dictionary: values of a few distinct strings or integers, any index width
    index = draw(st.sampled_from(INDEX_TYPES))
    ordered = draw(st.booleans())
    if draw(st.booleans()):
        pool = draw(st.lists(st.text(max_size=6), min_size=1, max_size=5))
        value_type = draw(st.sampled_from([pa.string(), pa.large_string()]))
    else:
        pool = draw(st.lists(st.integers(-1000, 1000), min_size=1, max_size=5))
        value_type = pa.int32()
    values = draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n))
    plain = pa.array(values, type=value_type, mask=mask)
    encoded = pc.dictionary_encode(plain)
    return encoded.cast(pa.dictionary(index, value_type, ordered=ordered))


@st.composite
def tables(draw: Any, max_rows: int = 40, max_columns: int = 8, parquet: bool = False) -> pa.Table:
    """A table of 1..max_columns random columns, sometimes sliced or in several chunks."""
    n = draw(st.integers(0, max_rows))
    width = draw(st.integers(1, max_columns))
    columns = [draw(arrays(n, parquet=parquet)) for _ in range(width)]
    nullable = [draw(st.booleans()) or c.null_count > 0 for c in columns]
    fields = [
        pa.field(f"c{i}_{c.type}", c.type, nullable=nb, metadata={"k": str(i)} if i % 2 else None)
        for i, (c, nb) in enumerate(zip(columns, nullable, strict=True))
    ]
    metadata = {"origin": "hypothesis"} if draw(st.booleans()) else None
    table = pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=metadata))
    shape = draw(st.sampled_from(["whole", "slice", "chunks"]))
    if shape == "slice" and n:
        start = draw(st.integers(0, n))
        return table.slice(start, draw(st.integers(0, n - start)))
    if shape == "chunks" and n:
        cut = draw(st.integers(0, n))
        return pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    return table


def decoded(table: pa.Table) -> pa.Table:
    """``table`` with dictionary columns decoded (equality that ignores how
    several chunks' dictionaries were laid out)."""
    columns = []
    for column in table.columns:
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        columns.append(column)
    return pa.Table.from_arrays(columns, names=table.column_names)


def assert_same_table(got: pa.Table, expected: pa.Table) -> None:
    """Equal types, names, order, metadata, nulls and values."""
    assert got.schema.equals(expected.schema, check_metadata=True), (got.schema, expected.schema)
    assert got.num_rows == expected.num_rows
    for name, a, b in zip(got.column_names, got.columns, expected.columns, strict=True):
        assert a.null_count == b.null_count, name
    if all(c.num_chunks <= 1 for c in expected.columns):
        assert got.equals(expected, check_metadata=True)
    assert decoded(got).equals(decoded(expected))
