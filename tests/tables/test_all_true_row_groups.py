"""Row-group statistics prove a filter true for every row only where they are exact:
integer, date, timestamp and boolean columns with no null, never floats (their bounds
ignore NaN), strings, or a file written without statistics."""

from __future__ import annotations

import datetime as dt
import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nexus_cache.service._table_scan import RowGroupChoice, needs_no_mask
from nexus_cache.tables import DataFile, canonical_filter
from nexus_cache.tables.pruning import may_prove_all_true, split_row_groups

ROWS, GROUP = 800, 100  # row group g holds i = 100 g .. 100 g + 99


def _table() -> pa.Table:
    i = np.arange(ROWS)
    w = (i / ROWS).astype(float)
    w[250] = np.nan  # row group 2: its statistics (0.25 .. 0.34) do not show the NaN
    n = pa.array([None if k == 350 else int(k) for k in i], pa.int64())  # a null in group 3
    return pa.table(
        {
            "i": pa.array(i, pa.int64()),
            "k": pa.array(i // GROUP + 1, pa.int32()),  # 1 .. 8, one value per group
            "t": pa.array(i * 1_000_000 + 1, pa.timestamp("ns")),  # 1 ns after each ms
            "d": pa.array(i.astype(np.int32), pa.int32()).cast(pa.date32()),
            "b": pa.array(i >= 400),
            "w": pa.array(w),
            "n": n,
            "s": pa.array([f"s{k:04d}" for k in i]),
        }
    )


def _footer(**write: Any) -> pq.FileMetaData:
    out = io.BytesIO()
    pq.write_table(_table(), out, row_group_size=GROUP, **write)
    return pq.ParquetFile(io.BytesIO(out.getvalue())).metadata


def _split(flt: Any, schema: pa.Schema | None = None, **write: Any) -> tuple[Any, Any]:
    canonical = canonical_filter(flt, _table().schema if schema is None else schema)
    return split_row_groups(_footer(**write), canonical)


@pytest.mark.parametrize(
    ("flt", "kept", "all_true"),
    [
        ([("i", ">=", 200), ("i", "<", 400)], (2, 3), (2, 3)),
        ([("i", "<", 350)], (0, 1, 2, 3), (0, 1, 2)),  # group 3 holds 350 .. 399
        ([("i", "!=", 150)], tuple(range(8)), (0, 2, 3, 4, 5, 6, 7)),
        ([("k", "=", 3)], (2,), (2,)),
        ([("k", "in", [2, 3, 5])], (1, 2, 4), (1, 2, 4)),
        ([("k", "not in", [2, 3])], (0, 3, 4, 5, 6, 7), (0, 3, 4, 5, 6, 7)),
        ([("d", ">", "1970-01-04"), ("d", "<=", "1970-07-19")], (0, 1), (1,)),
        ([("b", "=", True)], (4, 5, 6, 7), (4, 5, 6, 7)),
        ([[("i", "<", 100)], [("i", ">=", 700)]], (0, 7), (0, 7)),  # OR: either clause
        ([[("i", "<", 100)], [("w", ">", 0.5)]], (0, 4, 5, 6, 7), (0,)),
    ],
)
def test_exact_statistics_prove_every_row_of_a_group_passes(
    flt: Any, kept: tuple[int, ...], all_true: tuple[int, ...]
) -> None:
    assert _split(flt) == (kept, all_true)


def test_timestamps_are_proven_in_the_filters_unit_rounded_outwards() -> None:
    # the file holds ns, 1 ns after each ms; the table reads microseconds
    schema = _table().schema.set(2, pa.field("t", pa.timestamp("us")))
    before = dt.datetime(1970, 1, 1, 0, 0, 0, 400_000, tzinfo=dt.timezone.utc)  # i < 400
    assert _split([("t", "<", before)], schema) == ((0, 1, 2, 3), (0, 1, 2, 3))
    last = dt.datetime(1970, 1, 1, 0, 0, 0, 399_000, tzinfo=dt.timezone.utc)  # i = 399, +1 ns
    # 399 ms + 1 ns is after 399 ms: the group is kept (ceil) and not proven
    assert _split([("t", "<=", last)], schema) == ((0, 1, 2, 3), (0, 1, 2))
    assert _split([("t", "<=", last)]) == ((0, 1, 2, 3), (0, 1, 2))


@pytest.mark.parametrize(
    "flt",
    [
        [("w", "<", 0.5)],  # floats: NaN is not in the bounds and fails the test
        [("w", ">=", 0.0)],
        [("s", ">=", "s0000")],  # strings: bounds may be truncated
        [("n", ">=", 300), ("n", "<", 400)],  # a null in group 3
    ],
)
def test_no_proof_from_floats_strings_or_a_group_with_nulls(flt: Any) -> None:
    kept, all_true = _split(flt)
    assert kept  # kept: the statistics allow a passing row
    assert all_true == ()


def test_no_proof_without_statistics() -> None:
    assert _split([("i", "<", 400)], write_statistics=False) == (tuple(range(8)), ())


def test_partition_values_decide_their_predicates_in_the_proof() -> None:
    table = _table()
    schema = table.schema.append(pa.field("day", pa.int32()))
    flt = canonical_filter([("day", "=", 4), ("i", "<", 200)], schema)
    assert flt is not None
    inside = DataFile("day=4/a.parquet", 1, partition=(("day", 4),))
    assert split_row_groups(_footer(), flt, inside) == ((0, 1), (0, 1))
    outside = DataFile("day=5/a.parquet", 1, partition=(("day", 5),))
    assert split_row_groups(_footer(), flt, outside) == ((), ())
    assert may_prove_all_true(flt) is True
    text = canonical_filter([("day", "=", 4), ("s", "=", "x")], schema)
    assert text is not None
    assert may_prove_all_true(text) is False
    assert may_prove_all_true(text, ["day", "s"]) is True


def _choice(total: int, kept: tuple[int, ...], all_true: tuple[int, ...]) -> RowGroupChoice:
    return RowGroupChoice(None, total, kept, None, all_true)


def test_a_frame_needs_no_mask_only_when_it_holds_proven_row_groups_alone() -> None:
    proven = _choice(8, (2, 3), (2, 3))
    assert needs_no_mask((2, 3), proven) is True
    assert needs_no_mask((), proven) is True  # nothing held
    # the whole object's entry (an earlier unfiltered scan): the pruned groups' rows too
    assert needs_no_mask(None, proven) is False
    assert needs_no_mask((2, 3), _choice(8, (2, 3), (2,))) is False
    assert needs_no_mask((2, 3), None) is False  # no footer read: no proof
    assert needs_no_mask(None, _choice(2, (0, 1), (0, 1))) is True  # every group proven
