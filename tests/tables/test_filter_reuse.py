"""A filter of plain values is checked and made canonical once per schema: a repeated
query's filter is the one made before. Values are never taken for others of another
type (``1``, ``1.0``, ``True``, ``'1'``, a NumPy integer), a filter on another
schema is typed for that schema, and a refused filter is refused every time."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from nexus_cache.errors import ConfigError
from nexus_cache.tables import canonical_filter
from nexus_cache.tables import filters as filters_module

_SCHEMA = pa.schema(
    [("x", pa.int64()), ("b", pa.bool_()), ("s", pa.string()), ("w", pa.float64())]
)


def test_a_repeated_filter_is_made_canonical_once(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    real = filters_module._predicate

    def counting(item: Any, schema: pa.Schema) -> Any:
        made.append(item)
        return real(item, schema)

    monkeypatch.setattr(filters_module, "_predicate", counting)
    raw = [("x", "in", [3, 1, 2]), ("w", ">", 0.5), ("s", "!=", "a")]
    first = canonical_filter(raw, _SCHEMA)
    assert len(made) == 3
    # the same filter, a schema equal to the first (another object): nothing is made
    again = canonical_filter(
        [("x", "in", [3, 1, 2]), ("w", ">", 0.5), ("s", "!=", "a")], pa.schema(list(_SCHEMA))
    )
    assert again is first
    assert len(made) == 3
    assert first is not None
    assert first.key == ('[[["s","!=","a"],["w",">",0.5],["x","in",[1,2,3]]]]')


@pytest.mark.parametrize(
    ("accepted", "refused"),
    [
        ([("x", "=", 1)], [("x", "=", True)]),
        ([("b", "=", True)], [("b", "=", 1)]),
        ([("s", "=", "1")], [("s", "=", 1)]),
        ([("x", "=", 1)], [("x", "=", np.int64(1))]),
        ([("w", ">", 1)], [("w", ">", "1")]),
    ],
    ids=["bool-for-int", "int-for-bool", "int-for-str", "numpy-int", "str-for-float"],
)
def test_a_value_of_another_type_is_not_taken_for_a_remembered_one(
    accepted: list[Any], refused: list[Any]
) -> None:
    assert canonical_filter(accepted, _SCHEMA) is not None
    with pytest.raises(ConfigError):
        canonical_filter(refused, _SCHEMA)


def test_an_int_and_a_float_of_one_value_stay_apart() -> None:
    whole = canonical_filter([("x", "<", 2)], _SCHEMA)
    half = canonical_filter([("x", "<", 2.5)], _SCHEMA)
    assert whole is not None
    assert half is not None
    assert whole.clauses[0][0].value == 2
    assert half.clauses[0][0].value == 2.5


def test_the_same_filter_on_another_schema_is_typed_for_that_schema() -> None:
    raw = [("x", "=", 1 << 40)]
    wide = canonical_filter(raw, pa.schema([("x", pa.int64())]))
    assert wide is not None
    assert wide.schema.field("x").type == pa.int64()
    with pytest.raises(ConfigError, match="outside the range"):
        canonical_filter(raw, pa.schema([("x", pa.int32())]))
    text = pa.schema([("x", pa.string())])
    with pytest.raises(ConfigError, match="not a string"):
        canonical_filter(raw, text)
    assert canonical_filter([("x", "=", "1")], text) is not None


def test_a_refused_filter_is_refused_every_time() -> None:
    for _ in range(2):
        with pytest.raises(ConfigError, match="no column 'nope'"):
            canonical_filter([("nope", "=", 1)], _SCHEMA)
