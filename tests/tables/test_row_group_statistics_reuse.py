"""Row-group pruning reads a footer's statistics once per footer object: a footer
kept and passed again (the service keeps one per object's proven identity) is
pruned from what was read before, with the same answer as a footer parsed anew;
the memory goes when the footer does."""

from __future__ import annotations

import gc
import importlib
import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nexus_cache.tables import canonical_filter

_pruning = importlib.import_module("nexus_cache.tables.pruning")


def _footer(raw: bytes) -> Any:
    return pq.ParquetFile(io.BytesIO(raw)).metadata


@pytest.fixture
def raw() -> bytes:
    n = 8000
    table = pa.table(
        {
            "ts": pa.array(np.arange(n), pa.int64()),
            "w": pa.array(np.linspace(0.0, 1.0, n), pa.float64()),
            "s": pa.array([f"k{i // 1000}" for i in range(n)]),
        }
    )
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=1000)
    return out.getvalue()


_FILTERS = [
    [("ts", "<", 2500)],
    [("ts", ">=", 7000), ("w", ">", 0.5)],
    [[("s", "=", "k3")], [("ts", "<", 10)]],
    [("w", "<", 0.0)],
    [("s", "in", ["k1", "k6"])],
]


def test_a_kept_footer_is_pruned_without_reading_its_statistics_again(
    raw: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = pq.read_schema(io.BytesIO(raw))
    footer = _footer(raw)
    reads = []
    real = _pruning._statistics

    def counted(*args: Any) -> Any:
        reads.append(1)
        return real(*args)

    monkeypatch.setattr(_pruning, "_statistics", counted)
    first = [_pruning.prune_row_groups(footer, canonical_filter(f, schema)) for f in _FILTERS]
    assert first[0] == (0, 1, 2)
    assert first[3] == ()
    assert first[4] == (1, 6)
    read_once = len(reads)
    assert read_once == 3 * 8  # each column's statistics in each row group, once
    again = [_pruning.prune_row_groups(footer, canonical_filter(f, schema)) for f in _FILTERS]
    assert again == first
    assert len(reads) == read_once
    # a footer parsed anew is read anew, and prunes the same
    fresh = [
        _pruning.prune_row_groups(_footer(raw), canonical_filter(f, schema)) for f in _FILTERS
    ]
    assert fresh == first
    assert len(reads) > read_once


def test_the_statistics_go_with_their_footer(raw: bytes) -> None:
    schema = pq.read_schema(io.BytesIO(raw))
    flt = canonical_filter([("ts", "<", 100)], schema)
    gc.collect()
    before = len(_pruning._FOOTER_STATS)
    footers = [_footer(raw) for _ in range(5)]
    for footer in footers:
        assert _pruning.prune_row_groups(footer, flt) == (0,)
    assert len(_pruning._FOOTER_STATS) == before + 5
    del footers, footer
    gc.collect()
    assert len(_pruning._FOOTER_STATS) == before
