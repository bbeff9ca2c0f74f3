"""Filters: validation before any byte is read, the canonical form and its key,
the pyarrow expression, and the ``--filter`` parser."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from nexus_cache.errors import ConfigError
from nexus_cache.tables import TableFilter, canonical_filter, parse_filter_arg
from nexus_cache.tables.filters import MAX_IN_VALUES

SCHEMA = pa.schema(
    [
        ("i", pa.int32()),
        ("f", pa.float64()),
        ("s", pa.string()),
        ("b", pa.bool_()),
        ("t", pa.timestamp("us")),
        ("tz", pa.timestamp("ms", tz="UTC")),
        ("d", pa.date32()),
        ("l", pa.list_(pa.int32())),
    ]
)


def test_every_spelling_of_one_filter_has_one_key() -> None:
    a = canonical_filter([("s", "==", "x"), ("i", ">", 3)], SCHEMA)
    b = canonical_filter([[["i", ">", 3.0], ["s", "=", "x"], ["i", ">", 3]]], SCHEMA)
    assert isinstance(a, TableFilter)
    assert isinstance(b, TableFilter)
    assert a.key == b.key == '[[["i",">",3],["s","=","x"]]]'
    assert a.digest == b.digest
    assert len(a.digest) == 64
    ors = canonical_filter([[("s", "=", "y")], [("i", "in", [3, 1, 3])]], SCHEMA)
    again = canonical_filter([[("i", "in", [1, 3])], [("s", "=", "y")]], SCHEMA)
    assert ors is not None
    assert again is not None
    assert ors.key == again.key
    assert ors.columns == ("i", "s")


def test_json_lists_of_lists_round_trip() -> None:
    flt = canonical_filter(
        [[("t", ">=", "2025-01-01T00:00:00Z"), ("b", "=", True)], [("s", "not in", ["a", None])]],
        SCHEMA,
    )
    assert flt is not None
    text = json.dumps(flt.to_json())
    again = canonical_filter(json.loads(text), SCHEMA)
    assert again == flt
    assert again is not None
    assert again.key == flt.key
    # the timestamp is held in the column's unit (microseconds since the epoch)
    assert ["t", ">=", 1_735_689_600_000_000] in flt.to_json()[0]


def test_timestamps_from_iso_text_and_ints_are_one_value() -> None:
    a = canonical_filter([("tz", "<", "2025-01-01T01:00:00+01:00")], SCHEMA)
    b = canonical_filter([("tz", "<", 1_735_689_600_000)], SCHEMA)
    c = canonical_filter([("tz", "<", "2025-01-01")], SCHEMA)
    assert a is not None
    assert b is not None
    assert c is not None
    assert a.key == b.key == c.key
    d = canonical_filter([("d", "=", "2025-01-02")], SCHEMA)
    assert d is not None
    assert d.clauses[0][0].value == 20090


@pytest.mark.parametrize(
    ("filters", "words"),
    [
        ([("nope", "=", 1)], ["'nope'", "no column"]),
        ([("i", "~", 1)], ["unknown operator", "'~'"]),
        ([("i", "=", "x")], ["not a number", "int32"]),
        ([("s", "<", 3)], ["not a string"]),
        ([("b", "=", 1)], ["not a boolean"]),
        ([("t", ">", "yesterday")], ["ISO 8601"]),
        ([("i", "=", 1 << 40)], ["outside the range"]),
        ([("i", "in", 3)], ["takes a list"]),
        ([("i", "=", None)], ["in", "[null]"]),
        ([("l", "=", 1)], ["cannot be filtered"]),
        ([("i", "=")], ["three items"]),
        ([], ["empty"]),
        ("i > 3", ["not a list"]),
        ([("i", "=", 1), [("i", "=", 2)]], ["mixes"]),
        ([[]], ["empty list"]),
        ([(3, "=", 1)], ["not a (column, op, value) predicate"]),
    ],
)
def test_a_bad_filter_is_a_config_error_naming_it(filters: object, words: list[str]) -> None:
    with pytest.raises(ConfigError) as raised:
        canonical_filter(filters, SCHEMA)
    message = str(raised.value)
    assert message.startswith("filter ")
    for word in words:
        assert word in message, message


def test_a_filter_naming_no_column() -> None:
    for bad in ([("", "=", 1)], [[("i", ">", 1)], [(None, "=", 1)]]):
        with pytest.raises(ConfigError, match="filter"):
            canonical_filter(bad, SCHEMA)


def test_a_huge_in_list_is_refused_with_the_limit() -> None:
    huge = list(range(MAX_IN_VALUES + 1))
    with pytest.raises(ConfigError) as raised:
        canonical_filter([("i", "in", huge)], SCHEMA)
    message = str(raised.value)
    assert str(MAX_IN_VALUES) in message
    assert len(message) < 500
    ok = canonical_filter([("i", "in", huge[:MAX_IN_VALUES])], SCHEMA)
    assert ok is not None
    assert len(ok.clauses[0][0].value) == MAX_IN_VALUES


def test_the_expression_is_pyarrows_meaning() -> None:
    table = pa.table(
        {
            "i": pa.array([1, 2, None, 4], pa.int32()),
            "s": pa.array(["a", None, "c", "d"]),
        }
    )
    flt = canonical_filter(
        [[("i", ">", 1), ("s", "!=", "c")], [("s", "not in", ["a", "d"])]], table.schema
    )
    assert flt is not None
    got = table.filter(flt.to_expression()).to_pylist()
    import pyarrow.parquet as pq

    want = table.filter(pq.filters_to_expression(flt.to_json())).to_pylist()
    assert got == want == [{"i": 2, "s": None}, {"i": None, "s": "c"}, {"i": 4, "s": "d"}]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("i=3", ["i", "=", 3]),
        ("i==3", ["i", "=", 3]),
        ("i!=3", ["i", "!=", 3]),
        ("i<3", ["i", "<", 3]),
        ("i<=3", ["i", "<=", 3]),
        ("i>3", ["i", ">", 3]),
        ("i >= -3", ["i", ">=", -3]),
        ("f<2.5", ["f", "<", 2.5]),
        ("s=12", ["s", "=", "12"]),
        ("s='a b'", ["s", "=", "a b"]),
        ("b=true", ["b", "=", True]),
        ("t>=2025-01-01T00:00:00", ["t", ">=", "2025-01-01T00:00:00"]),
        ("i in 1,2,3", ["i", "in", [1, 2, 3]]),
        ("s not in x,,y", ["s", "not in", ["x", None, "y"]]),
    ],
)
def test_the_cli_expression_reads_values_as_the_columns_type(
    text: str, want: list[object]
) -> None:
    got = parse_filter_arg(text, SCHEMA)
    assert got == want
    assert canonical_filter([got], SCHEMA) is not None


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("s in 'a,b',c", ["a,b", "c"]),
        ('s in "x, y" , z,"a\'b,c"', ["x, y", "z", "a'b,c"]),
        ("s not in 'a,b' ,'c d'", ["a,b", "c d"]),
        ("s in 'null',null,''", ["null", None, ""]),
        ("s in q\"x,'a", ['q"x', "'a"]),  # a quote inside a word, or one never closed
        ("s in 'a'b,c", ["'a'b", "c"]),  # the quote is not followed by a comma
    ],
)
def test_a_quoted_in_item_keeps_its_commas(text: str, want: list[object]) -> None:
    got = parse_filter_arg(text, SCHEMA)
    assert got[2] == want
    assert canonical_filter([got], SCHEMA) is not None


@pytest.mark.parametrize(
    ("text", "word"),
    [
        ("x=1", "no column"),
        ("i=abc", "not a number"),
        ("b=yes", "true or false"),
        ("i", "not an expression"),
    ],
)
def test_a_bad_cli_expression_names_it(text: str, word: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_filter_arg(text, SCHEMA)
    assert word in str(raised.value)
