"""File pruning decides a partition predicate once per distinct partition (not once
per file), converts metadata values with one check per column type, and prunes
exactly as a file-by-file decision does."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pytest

from nexus_cache.tables import DataFile, TableSnapshot, canonical_filter, prune_files
from nexus_cache.tables.filters import _canonical_of, _canonical_value
from nexus_cache.tables.pruning import residual_filter


class _Counted(int):
    """A partition value that counts the comparisons made with it."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        type(self).compared += 1
        return int(self) == other

    __hash__ = int.__hash__


def _snapshot(files: list[DataFile]) -> TableSnapshot:
    schema = pa.schema([("v", pa.float64()), ("day", pa.int32())])
    return TableSnapshot(
        kind="delta",
        location="/t",
        version=0,
        schema=schema,
        partition_schema=pa.schema([("day", pa.int32())]),
        files=tuple(files),
    )


def test_a_partition_predicate_is_decided_once_per_distinct_partition() -> None:
    days = [_Counted(1), _Counted(2)]
    files = [
        DataFile(
            path=f"/t/day={days[i % 2]}/part-{i}.parquet",
            size=10,
            partition=(("day", days[i % 2]),),
            row_count=5,
            min_values=(("v", float(i)),),
            max_values=(("v", float(i + 1)),),
            null_counts=(("v", 0),),
        )
        for i in range(400)
    ]
    snap = _snapshot(files)
    flt = canonical_filter([("day", "=", 2), ("v", "<", 100.0)], snap.schema)
    assert flt is not None
    _Counted.compared = 0
    kept, by_partition, by_statistics = prune_files(snap, flt)
    assert _Counted.compared <= 2  # once per partition, not 400 times
    assert by_partition == 200
    # every file decided as a file-by-file decision decides it
    alone = [f for f in files if residual_filter(flt, f) is not False]
    assert by_statistics == sum(1 for f in alone if f.min_values[0][1] >= 100.0)
    assert list(kept) == [f for f in alone if f.min_values[0][1] < 100.0]


_VALUES: list[Any] = [
    None,
    0,
    -(1 << 31),
    1 << 31,
    (1 << 63) - 1,
    1 << 64,
    True,
    False,
    2.0,
    2.5,
    float("nan"),
    float("inf"),
    "x",
    b"x",
    b"\xff",
    [1],
]


@pytest.mark.parametrize(
    "arrow_type",
    [
        pa.int8(),
        pa.int32(),
        pa.int64(),
        pa.uint8(),
        pa.float32(),
        pa.float64(),
        pa.string(),
        pa.large_string(),
        pa.bool_(),
        pa.dictionary(pa.int32(), pa.string()),
        pa.timestamp("us"),
        pa.date32(),
    ],
    ids=str,
)
def test_the_converter_of_a_type_gives_what_canonical_value_gives(arrow_type) -> None:
    convert = _canonical_of(arrow_type)
    for value in _VALUES:
        try:
            want = _canonical_value(value, arrow_type)
        except TypeError:  # an unhashable list in a set: not a metadata value
            continue
        got = convert(value)
        if isinstance(want, float) and math.isnan(want):
            assert isinstance(got, float)
            assert math.isnan(got)
        else:
            assert got == want, (value, got, want)
            assert type(got) is type(want), (value, got, want)
