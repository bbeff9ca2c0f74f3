"""A partition test decides each partition as the clause-by-clause reading of the
filter does: a partition may hold a matching row unless every clause has a predicate
on a partition column that its value decides false (a value of another type, or a
column the filter does not name, proves nothing). Random filters and partitions."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from nexus_cache.tables import canonical_filter
from nexus_cache.tables._ranges import decide_predicate
from nexus_cache.tables.filters import TableFilter, _canonical_value
from nexus_cache.tables.pruning import partition_test

_SCHEMA = pa.schema([("day", pa.int32()), ("kind", pa.string()), ("w", pa.float64())])
_OPS = ["=", "!=", "<", "<=", ">", ">=", "in", "not in"]


def _reference(flt: TableFilter, partition: tuple[tuple[str, Any], ...]) -> bool:
    """The clause-by-clause decision: the filter's columns among the values, typed."""
    known = {}
    for name, value in partition:
        if name in flt.columns:
            typed = _canonical_value(value, flt.schema.field(name).type)
            if typed is not None or value is None:
                known[name] = typed
    if not known:
        return True
    for clause in flt.clauses:
        if all(
            p.column not in known or decide_predicate(p, known[p.column]) is not False
            for p in clause
        ):
            return True
    return False


def _value(rng: random.Random, column: str) -> Any:
    if column == "day":
        return rng.choice([0, 1, 2, 3, 7])
    if column == "kind":
        return rng.choice(["a", "b", "c"])
    return rng.choice([0.5, 1.5, 2.5])


def _predicate(rng: random.Random) -> list[Any]:
    column = rng.choice(["day", "kind", "w"])
    op = rng.choice(_OPS)
    if op in ("in", "not in"):
        values: list[Any] = [_value(rng, column) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.3:
            values.append(None)
        return [column, op, values]
    return [column, op, _value(rng, column)]


@pytest.mark.parametrize("seed", range(20))
def test_each_partition_is_decided_as_clause_by_clause(seed: int) -> None:
    rng = random.Random(seed)
    clauses = [
        [_predicate(rng) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 3))
    ]
    flt = canonical_filter(clauses, _SCHEMA)
    assert flt is not None
    test = partition_test(flt)
    days: list[Any] = [None, 0, 1, 2, 3, 7, "x"]  # "x": not an int32, proves nothing
    kinds: list[Any] = [None, "a", "b", "c"]
    for day in days:
        for kind in kinds:
            for partition in (
                (("day", day), ("kind", kind)),
                (("day", day),),
                (("kind", kind), ("other", 5)),
                (),
            ):
                assert test(partition) == _reference(flt, partition), (clauses, partition)
                assert test(partition) == _reference(flt, partition)  # remembered


class _Counted(int):
    """A partition value that counts the comparisons made with it."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        type(self).compared += 1
        return int(self) == other

    __hash__ = int.__hash__


def test_a_repeated_filter_decides_each_partition_once() -> None:
    partitions = [(("day", _Counted(d)),) for d in range(8)]
    raw = [("day", "in", [2, 5]), ("w", ">", 0.5)]
    _Counted.compared = 0
    first = partition_test(canonical_filter(raw, _SCHEMA))  # type: ignore[arg-type]
    kept = [first(p) for p in partitions]
    decided = _Counted.compared
    assert decided > 0
    assert kept == [d in (2, 5) for d in range(8)]
    # the next query's filter, made again from its text: no partition decided again
    again = partition_test(canonical_filter([("w", ">", 0.5), ("day", "in", [5, 2])], _SCHEMA))  # type: ignore[arg-type]
    again_kept = [again(p) for p in partitions]
    assert _Counted.compared == decided
    assert again_kept == kept


def test_the_same_filter_on_another_schema_is_decided_for_it() -> None:
    ints = pa.schema([("day", pa.int32())])
    texts = pa.schema([("day", pa.string())])
    on_ints = partition_test(canonical_filter([("day", "in", [1])], ints))  # type: ignore[arg-type]
    on_texts = partition_test(canonical_filter([("day", "in", ["1"])], texts))  # type: ignore[arg-type]
    assert on_ints((("day", 1),)) is True
    assert on_ints((("day", 2),)) is False
    assert on_texts((("day", "1"),)) is True
    assert on_texts((("day", 1),)) is True  # an int is no string value: no proof
