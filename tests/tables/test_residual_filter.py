"""residual_filter: the predicates on partition columns are decided per file, and only
what is left runs row by row; the rows kept are those the whole filter keeps."""

from __future__ import annotations

import pyarrow as pa

from nexus_cache.tables import canonical_filter
from nexus_cache.tables.pruning import residual_filter
from nexus_cache.tables.snapshot import DataFile

_SCHEMA = pa.schema([("day", pa.int32()), ("kind", pa.string()), ("w", pa.float64())])


def _file(day: int | None, kind: str | None) -> DataFile:
    return DataFile(f"/t/day={day}/kind={kind}/part-0.parquet", 10, (("day", day), ("kind", kind)))


def test_partition_predicates_are_decided_per_file() -> None:
    flt = canonical_filter([("day", "in", [1, 2]), ("w", ">", 0.5)], _SCHEMA)
    left = residual_filter(flt, _file(1, "a"))
    assert isinstance(left, type(flt))
    assert left.to_json() == [[["w", ">", 0.5]]]  # the day test is gone, w's is left
    assert residual_filter(flt, _file(3, "a")) is False  # no row of day=3 can match

    only_partitions = canonical_filter([("day", "=", 1), ("kind", "!=", "b")], _SCHEMA)
    assert residual_filter(only_partitions, _file(1, "a")) is True  # every row matches
    assert residual_filter(only_partitions, _file(1, "b")) is False


def test_or_of_ands_keeps_the_clauses_a_file_can_satisfy() -> None:
    flt = canonical_filter(
        [
            [("day", "=", 1), ("w", "<", 0.2)],
            [("day", "=", 2), ("w", ">", 0.8)],
            [("kind", "=", "z")],
        ],
        _SCHEMA,
    )
    assert residual_filter(flt, _file(2, "a")).to_json() == [[["w", ">", 0.8]]]  # type: ignore[union-attr]
    assert residual_filter(flt, _file(2, "z")) is True  # the third clause holds for all rows
    assert residual_filter(flt, _file(5, "a")) is False
    # two clauses that leave the same predicates leave one
    same = canonical_filter(
        [[("day", "=", 1), ("w", ">", 0.5)], [("day", "<", 3), ("w", ">", 0.5)]], _SCHEMA
    )
    assert residual_filter(same, _file(1, "a")).to_json() == [[["w", ">", 0.5]]]  # type: ignore[union-attr]
    # a filter with no partition predicate is returned as it is
    data_only = canonical_filter([("w", ">", 0.5)], _SCHEMA)
    assert residual_filter(data_only, _file(1, "a")) is data_only


def test_null_partitions_follow_pyarrow() -> None:
    null_file = _file(None, None)
    assert residual_filter(canonical_filter([("day", "=", 1)], _SCHEMA), null_file) is False
    assert residual_filter(canonical_filter([("day", "!=", 1)], _SCHEMA), null_file) is False
    assert (
        residual_filter(canonical_filter([("day", "in", [1, None])], _SCHEMA), null_file) is True
    )
    assert residual_filter(canonical_filter([("day", "not in", [1])], _SCHEMA), null_file) is True
    assert (
        residual_filter(canonical_filter([("day", "not in", [1, None])], _SCHEMA), null_file)
        is False
    )


def test_rows_kept_equal_the_whole_filters_on_every_file() -> None:
    filters = [
        [("day", "in", [1, 2]), ("w", ">", 0.5)],
        [[("day", "=", 1), ("w", "<", 0.3)], [("kind", "in", ["b", None]), ("w", ">=", 0.6)]],
        [("kind", "not in", ["a"]), ("day", "<=", 1)],
    ]
    w = pa.array([0.1, 0.3, 0.5, 0.6, 0.9, None])
    seen: set[object] = set()
    for raw in filters:
        flt = canonical_filter(raw, _SCHEMA)
        for day in (1, 2, None):
            for kind in ("a", "b", None):
                n = len(w)
                table = pa.table(
                    {
                        "day": pa.array([day] * n, pa.int32()),
                        "kind": pa.array([kind] * n, pa.string()),
                        "w": w,
                    }
                )
                want = table.filter(flt.to_expression())
                left = residual_filter(flt, _file(day, kind))
                if left is True:
                    got = table
                elif left is False:
                    got = table.slice(0, 0)
                else:
                    assert not {"day", "kind"} & set(left.columns)
                    got = table.filter(left.to_expression())
                assert got.equals(want), (raw, day, kind)
                seen.add(left if isinstance(left, bool) else "rows")
    assert seen == {True, False, "rows"}  # every outcome was compared


def test_a_repeated_filter_gets_the_residual_made_before_for_each_partition() -> None:
    raw = [("day", "in", [1, 2]), ("w", ">", 0.5)]
    flt = canonical_filter(raw, _SCHEMA)
    one, two, three = _file(1, "a"), _file(2, "a"), _file(3, "a")
    left = residual_filter(flt, one)
    again = canonical_filter([("w", ">", 0.5), ("day", "in", [2, 1])], _SCHEMA)
    assert residual_filter(again, _file(1, "a")) is left  # another file, the same values
    assert residual_filter(again, two) is not left  # another day: its own
    assert residual_filter(again, two).to_json() == [[["w", ">", 0.5]]]  # type: ignore[union-attr]
    assert residual_filter(again, three) is False
    # the same text on another schema: decided for that schema
    texts = pa.schema([("day", pa.string()), ("kind", pa.string()), ("w", pa.float64())])
    on_texts = canonical_filter([("day", "in", ["1", "2"]), ("w", ">", 0.5)], texts)
    assert residual_filter(on_texts, DataFile("/t/p.parquet", 10, (("day", "1"),))) is not left
