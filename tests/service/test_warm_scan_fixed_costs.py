"""A warm filtered scan repeats no per-query work that its query or its table's
unchanged objects already gave: the query's dict is made once per execute, a
successful attempt's statuses once, and a repeated scan makes no new
decoded-source key. What it returns is what pyarrow.dataset returns, and a file
added between two scans is read by the second."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from tests.service._helpers import age_files, make_service
from tests.tables._compare import assert_same_rows

from nexus_cache.service import Scan, _attempt, _source_port
from nexus_cache.service.queries import Scan as ScanClass

_FILTER = [("day", "in", [1, 2]), ("w", ">", 0.25)]


@pytest.fixture
def hive(tmp_path: Path) -> Path:
    """edges/day=D/part-0.parquet: 4 partitions of 2,000 rows, aged (provable)."""
    root = tmp_path / "edges"
    rng = np.random.default_rng(3)
    for day in range(4):
        part = root / f"day={day}"
        part.mkdir(parents=True)
        table = pa.table({"src": rng.integers(0, 100, 2000), "w": rng.random(2000)})
        pq.write_table(table, part / "part-0.parquet")
    age_files(root)
    return root


def _reference(root: Path, flt: Any) -> pa.Table:
    dataset = ds.dataset(root, format="parquet", partitioning="hive")
    return dataset.to_table(columns=["src", "w"], filter=pq.filters_to_expression(flt))


def test_a_query_dict_is_made_once_per_execute(
    hive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Any] = []
    real = ScanClass.to_dict

    def counting(self: ScanClass) -> dict[str, Any]:
        made.append(self)
        return real(self)

    with make_service(tmp_path / "svc") as service:
        scan = Scan(str(hive), ("src", "w"), filter=_FILTER)
        service.execute(scan)  # cold: fills the source cache
        monkeypatch.setattr(ScanClass, "to_dict", counting)
        result = service.execute(scan)
    # the grant memory's key, the attempt's evidence and the diagnostics share one
    assert len(made) == 1
    assert result.diagnostics.query == scan.to_dict()
    assert result.diagnostics.source_cache["status"] == "hit"
    assert_same_rows(result.table, _reference(hive, _FILTER))


def test_a_successful_attempts_statuses_are_made_once(
    hive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Any] = []
    real = _attempt.AttemptOutcome.statuses

    def counting(self: Any, plan: Any) -> dict[str, Any]:
        made.append(plan)
        return real(self, plan)

    monkeypatch.setattr(_attempt.AttemptOutcome, "statuses", counting)
    with make_service(tmp_path / "svc") as service:
        result = service.execute(Scan(str(hive), ("src", "w"), filter=_FILTER))
    assert len(made) == 1
    assert result.diagnostics.table["rows_after_filter"] == result.table.num_rows
    assert result.diagnostics.lakehouse is not None


def test_a_repeated_scan_makes_no_new_source_key(
    hive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Any] = []
    real = _source_port.SourceFrameKey

    def counting(*args: Any, **kwargs: Any) -> Any:
        made.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(_source_port, "SourceFrameKey", counting)
    with make_service(tmp_path / "svc") as service:
        # every object decoded whole with the columns a filtered scan projects
        service.execute(Scan(str(hive), ("src", "w", "day")))
        assert len(made) == 4
        made.clear()
        other = [("day", "in", [1, 2]), ("w", "<", 0.5)]
        first = service.execute(Scan(str(hive), ("src", "w"), filter=_FILTER))
        second = service.execute(Scan(str(hive), ("src", "w"), filter=other))
        assert made == []  # the keys the first scan made, for both kept objects
        assert first.diagnostics.source_cache["status"] == "hit"
        assert second.diagnostics.source_cache["status"] == "hit"
        assert_same_rows(second.table, _reference(hive, other))
        # a file added to a kept partition: a new object, with its own key
        extra = pa.table({"src": pa.array([7, 8], pa.int64()), "w": pa.array([0.1, 0.9])})
        added = hive / "day=2" / "part-1.parquet"
        pq.write_table(extra, added)
        past = added.stat().st_mtime - 60  # provable, the other files untouched
        os.utime(added, (past, past))
        third = service.execute(Scan(str(hive), ("src", "w"), filter=other))
        assert len(made) == 1
        assert_same_rows(third.table, _reference(hive, other))


def test_an_unwritten_evidence_document_is_built_when_its_digest_is_first_read(
    hive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no evidence directory nothing reads an attempt's document until its digest
    is read: a warm query neither builds it (the plan's dict) nor serialises it;
    reading the digest builds it once, and a second read gives the same digest."""
    made: list[Any] = []
    real = _attempt.AttemptPlan.to_dict

    def counting(self: Any, *, query: bool = True) -> dict[str, Any]:
        made.append(self)
        return real(self, query=query)

    with make_service(tmp_path / "svc", evidence_dir=None) as service:
        scan = Scan(str(hive), ("src", "w"), filter=_FILTER)
        service.execute(scan)
        monkeypatch.setattr(_attempt.AttemptPlan, "to_dict", counting)
        result = service.execute(scan)
        assert made == []
        digest = result.diagnostics.attempts[0].evidence_digest
        assert len(made) == 1
        assert len(digest) == 64
        assert int(digest, 16) >= 0
        assert result.diagnostics.attempts[0].evidence_digest == digest
        assert len(made) == 1
    assert_same_rows(result.table, _reference(hive, _FILTER))


def test_an_evidence_writer_without_a_directory_makes_the_document_when_read(
    tmp_path: Path,
) -> None:
    from nexus_cache.service.evidence import EVIDENCE_FORMAT, EvidenceWriter, seal_digest

    calls: list[int] = []

    def make() -> dict[str, Any]:
        calls.append(1)
        return {"attempt_id": "a-1", "outcome": "ok"}

    deferred = EvidenceWriter(None).digest(make)
    assert calls == []
    assert callable(deferred)
    want = seal_digest({**make(), "format": EVIDENCE_FORMAT, "previous_digest": None})
    assert deferred() == want
    written = EvidenceWriter(tmp_path / "evidence").digest(make)  # made and sealed now
    assert isinstance(written, str)
    assert len(calls) == 3
    assert list((tmp_path / "evidence").glob("attempt-*.json"))


def test_a_repeated_filter_over_a_kept_snapshot_prunes_no_file_again(
    hive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pruning of a table read is a pure function of its snapshot, filter and
    columns: a repeated query over a snapshot its listing keeps prunes nothing again,
    while another filter, other columns, or a file changed between two queries (a
    snapshot resolved anew) is pruned afresh and gives its own rows."""
    from nexus_cache.service import _table_scan
    from nexus_cache.tables import _hive_pruned

    # the fixture's directories were made just now: count them settled, so the
    # listing keeps its snapshot (as it does a table's that has not changed lately)
    monkeypatch.setattr(_hive_pruned, "_SETTLED_S", 0.0)
    pruned: list[Any] = []
    real = _table_scan.plan_scan

    def counting(snapshot: Any, flt: Any, *args: Any) -> Any:
        pruned.append(flt)
        return real(snapshot, flt, *args)

    monkeypatch.setattr(_table_scan, "plan_scan", counting)
    other = [("day", "in", [2, 3]), ("w", "<", 0.5)]
    with make_service(tmp_path / "svc") as service:
        first = service.execute(Scan(str(hive), ("src", "w"), filter=_FILTER))
        again = service.execute(Scan(str(hive), ("src", "w"), filter=_FILTER))
        assert len(pruned) == 1
        assert_same_rows(again.table, _reference(hive, _FILTER))
        same = ("filter_digest", "projected_columns", "objects_planned", "objects_read")
        same += ("pruned_by_partition", "pruned_by_statistics", "rows_after_filter")
        for name in same:
            assert again.diagnostics.table[name] == first.diagnostics.table[name], name
        second = service.execute(Scan(str(hive), ("src", "w"), filter=other))
        assert len(pruned) == 2
        assert_same_rows(second.table, _reference(hive, other))
        narrow = service.execute(Scan(str(hive), ("w",), filter=other))
        assert len(pruned) == 3
        assert narrow.table.column_names == ["w"]
        # a kept file rewritten with other rows (another size): the listing's snapshot
        # no longer holds, the new one is pruned afresh and its rows are the new ones
        path = hive / "day=2" / "part-0.parquet"
        pq.write_table(
            pa.table({"src": pa.array([5, 6, 7]), "w": pa.array([0.1, 0.2, 0.3])}), path
        )
        age_files(hive)
        changed = service.execute(Scan(str(hive), ("src", "w"), filter=other))
        assert len(pruned) == 4
        assert_same_rows(changed.table, _reference(hive, other))
        assert sorted(changed.table.column("src").to_pylist()).count(6) >= 1
