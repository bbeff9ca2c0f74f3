"""Scans of lakehouse tables through the service: filters, as_of, partitions, pruning."""

from __future__ import annotations

import pytest

from nexus_cache.errors import ConfigError
from nexus_cache.service import Scan, as_query


def test_scan_filter_in_pyarrow_form_round_trips_as_json_lists() -> None:
    scan = Scan("/t", filter=[("year", "=", 2025), ("region", "in", ["eu", "us"])], as_of=2)
    assert scan.filter == ((("year", "=", 2025), ("region", "in", ("eu", "us"))),)
    data = scan.to_dict()
    assert data["filter"] == [[["year", "=", 2025], ["region", "in", ["eu", "us"]]]]
    assert data["as_of"] == 2
    assert as_query(data) == scan
    # an OR of ANDs keeps its clauses
    ors = Scan("/t", filter=[[("a", ">", 1)], [("b", "<", 0.5)]])
    assert ors.filter == ((("a", ">", 1),), (("b", "<", 0.5),))
    assert hash(ors) == hash(as_query(ors.to_dict()))


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"filter": "year=2025"}, "Scan.filter='year=2025'"),
        ({"filter": []}, "Scan.filter=\\[\\]"),
        ({"filter": [("year", "=")]}, "Scan.filter predicate"),
        ({"filter": [("year", "~", 1)]}, "op '~' is not accepted"),
        ({"filter": [("year", "=", {"a": 1})]}, "is not accepted; use a JSON scalar"),
        ({"filter": [("year", "in", [[1]])]}, "a nested list is not accepted"),
        ({"filter": [("year", "=", 1), [("a", "=", 1)]]}, "Scan.filter="),
        ({"as_of": "3"}, "Scan.as_of='3'"),
        ({"as_of": True}, "Scan.as_of=True"),
        ({"as_of": 1.5}, "Scan.as_of=1.5"),
    ],
)
def test_scan_refuses_a_malformed_filter_or_as_of_naming_the_field(kwargs, words) -> None:
    with pytest.raises(ConfigError, match=words):
        Scan("/t", **kwargs)
