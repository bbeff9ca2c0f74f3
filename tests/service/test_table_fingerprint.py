"""``table_fingerprint``: the schema and the values of a result, whatever its chunking,
slicing or the bytes Arrow leaves under a null; hashed from the buffers in place."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from nexus_cache.service import table_fingerprint


def _table() -> pa.Table:
    return pa.table(
        {
            "i": pa.array([1, None, 3, 4, 5, 6], pa.int64()),
            "f": [0.5, 1.5, None, 3.5, 4.5, 5.5],
            "s": ["a", "bb", None, "dddd", "", "é"],
            "b": [True, False, None, True, False, True],
            "ts": pa.array([1, 2, 3, 4, 5, 6], pa.timestamp("s", tz="UTC")),
            "d": pa.array(["x", "y", "x", "y", "x", None]).dictionary_encode(),
            "l": [[1], [2], [], None, [3], [4, 5]],
        }
    )


@pytest.mark.parametrize("chunk", [1, 2, 4, 5])
def test_equal_across_chunkings_and_slices(chunk: int) -> None:
    table = _table()
    rechunked = pa.Table.from_batches(table.to_batches(max_chunksize=chunk))
    assert table_fingerprint(rechunked) == table_fingerprint(table)
    # the same rows as a slice of a larger table (offsets not at 0)
    doubled = pa.concat_tables([table, table]).combine_chunks()
    assert table_fingerprint(doubled.slice(6)) == table_fingerprint(table)
    assert table_fingerprint(doubled.slice(3, 6)) != table_fingerprint(table)


@pytest.mark.parametrize(
    ("name", "changed"),
    [
        ("i", pa.array([1, None, 3, 4, 5, 7], pa.int64())),  # a value
        ("i", pa.array([1, None, 3, 4, 5, 6], pa.int32())),  # a type
        ("i", pa.array([1, 0, 3, 4, 5, 6], pa.int64())),  # a null became a value
        ("s", pa.array(["a", "b", None, "bdddd", "", "é"])),  # same bytes, other lengths
        ("b", pa.array([True, False, None, True, True, True])),
        ("d", pa.array(["x", "y", "x", "x", "x", None]).dictionary_encode()),
    ],
)
def test_different_for_a_changed_value_or_type(name: str, changed: pa.Array) -> None:
    table = _table()
    other = table.set_column(table.schema.get_field_index(name), name, changed)
    assert table_fingerprint(other) != table_fingerprint(table)


def test_the_bytes_under_a_null_do_not_count() -> None:
    """Arrow leaves the value under a null undefined: two arrays that differ only
    there hold the same values."""
    validity = pa.py_buffer(np.packbits([1, 0, 1], bitorder="little"))

    def ints(hidden: int) -> pa.Array:
        data = pa.py_buffer(np.array([7, hidden, 9], np.int64))
        return pa.Array.from_buffers(pa.int64(), 3, [validity, data], null_count=1)

    def strings(hidden: bytes) -> pa.Array:
        offsets = pa.py_buffer(np.array([0, 1, 1 + len(hidden), 2 + len(hidden)], np.int32))
        data = pa.py_buffer(b"a" + hidden + b"c")
        return pa.Array.from_buffers(pa.string(), 3, [validity, offsets, data], null_count=1)

    assert ints(8).to_pylist() == ints(123).to_pylist()
    assert table_fingerprint(pa.table({"x": ints(8)})) == table_fingerprint(
        pa.table({"x": ints(123)})
    )
    assert table_fingerprint(pa.table({"x": strings(b"")})) == table_fingerprint(
        pa.table({"x": strings(b"hidden")})
    )


def test_a_large_table_hashed_on_threads_matches_one_thread() -> None:
    """Past the size where columns are hashed concurrently, the digest is the one a
    small chunk-by-chunk table of the same values gives."""
    n = 3 << 18  # 3 columns x 6 MiB: hashed a column per thread
    table = pa.table({"a": np.arange(n), "b": np.arange(n) * 0.5, "c": np.arange(n)[::-1]})
    assert table.nbytes >= 4 << 20
    parts = [table.slice(i, 1 << 16) for i in range(0, n, 1 << 16)]
    small = [table_fingerprint(p) for p in parts]  # each below the threshold
    assert len(set(small)) == len(parts)
    assert table_fingerprint(pa.concat_tables(parts)) == table_fingerprint(table)


def test_a_dictionary_column_counts_by_its_values_not_its_dictionary() -> None:
    def coded(indices: list[int], dictionary: list[str]) -> pa.Table:
        values = pa.array(dictionary, pa.string())
        array = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), values)
        return pa.table({"d": array})

    base = table_fingerprint(coded([0, 1, 0], ["x", "y"]))
    assert table_fingerprint(coded([1, 0, 1], ["y", "x"])) == base  # reordered
    assert table_fingerprint(coded([0, 1, 0], ["x", "y", "unused"])) == base
    assert table_fingerprint(coded([], ["x", "y"])) == table_fingerprint(coded([], []))
    assert table_fingerprint(coded([0, 1, 1], ["x", "y"])) != base
    # the schema still tells a dictionary column from a plain one
    assert table_fingerprint(pa.table({"d": ["x", "y", "x"]})) != base
