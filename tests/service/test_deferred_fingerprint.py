"""The result fingerprint where the service writes no evidence: computed when first
read, equal to the one computed before ``execute`` returns where evidence is written."""

from __future__ import annotations

import gc
import json
import pickle
import threading
import weakref
from pathlib import Path

import pytest

import nexus_cache.service.fingerprint as fingerprint_module
from nexus_cache.service import Scan, table_fingerprint

from ._helpers import make_lake, make_service


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the real fingerprint's calls (by number of rows hashed)."""
    calls: list[int] = []
    real = fingerprint_module.table_fingerprint

    def counting(table):  # type: ignore[no-untyped-def]
        calls.append(table.num_rows)
        return real(table)

    monkeypatch.setattr(fingerprint_module, "table_fingerprint", counting)
    monkeypatch.setattr("nexus_cache.service._runner.table_fingerprint", counting)
    return calls


def test_without_evidence_the_result_is_hashed_only_when_its_fingerprint_is_read(
    tmp_path: Path, hashed: list[int]
) -> None:
    lake = make_lake(tmp_path)
    with make_service(tmp_path, evidence_dir=None) as service:
        result = service.execute(Scan(lake.facts, columns=("amount", "region")))
        assert hashed == []  # execute returned without hashing its result
        diagnostics = result.diagnostics
        assert diagnostics.rows == result.table.num_rows
        digest = diagnostics.result_fingerprint
        assert hashed == [result.table.num_rows]
        assert digest == table_fingerprint(result.table)
        assert diagnostics.result_fingerprint == digest
        assert diagnostics.to_dict()["result_fingerprint"] == digest
        assert hashed == [result.table.num_rows]  # computed once, then kept


def test_with_evidence_the_fingerprint_is_recorded_before_execute_returns(
    tmp_path: Path, hashed: list[int]
) -> None:
    lake = make_lake(tmp_path)
    with make_service(tmp_path) as service:
        result = service.execute(Scan(lake.facts, columns=("amount",)))
        assert hashed == [result.table.num_rows]
        (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "evidence").glob("attempt-*")]
        assert doc["result"]["fingerprint"] == result.diagnostics.result_fingerprint
        assert result.diagnostics.result_fingerprint == table_fingerprint(result.table)


def test_a_deferred_fingerprint_equals_the_recorded_one_and_lets_the_table_go(
    tmp_path: Path,
) -> None:
    lake = make_lake(tmp_path)
    scan = Scan(lake.facts, columns=("amount", "region"))
    with make_service(tmp_path / "a") as recording:
        recorded = recording.execute(scan).diagnostics.result_fingerprint
    with make_service(tmp_path / "b", evidence_dir=None) as service:
        result = service.execute(scan)
        diagnostics = result.diagnostics
        table = weakref.ref(result.table)
        # many threads read it at once: one digest
        seen: list[str] = []
        threads = [
            threading.Thread(target=lambda: seen.append(diagnostics.result_fingerprint))
            for _ in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert set(seen) == {recorded}
        del result
        gc.collect()
        assert table() is None  # the diagnostics no longer hold the result
        assert diagnostics.result_fingerprint == recorded


def test_pickled_diagnostics_carry_the_digest_not_the_table(tmp_path: Path) -> None:
    lake = make_lake(tmp_path, fact_rows=50_000)
    with make_service(tmp_path, evidence_dir=None) as service:
        result = service.execute(Scan(lake.facts))
    data = pickle.dumps(result.diagnostics)
    assert len(data) < result.table.nbytes // 10
    again = pickle.loads(data)
    assert again == result.diagnostics
    assert again.result_fingerprint == table_fingerprint(result.table)
