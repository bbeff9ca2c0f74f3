"""An attempt's evidence digest where the service writes no evidence: sealed when
first read (the document alone), and recorded before ``execute`` returns where
evidence is written."""

from __future__ import annotations

import copy
import json
import pickle
import re
import threading
from pathlib import Path

import pytest

import nexus_cache.service.evidence as evidence_module
from nexus_cache.service import Scan

from ._helpers import make_lake, make_service


@pytest.fixture
def sealed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts the documents sealed (their attempt ids)."""
    calls: list[str] = []
    real = evidence_module.seal_digest

    def counting(doc):  # type: ignore[no-untyped-def]
        calls.append(str(doc["attempt_id"]))
        return real(doc)

    monkeypatch.setattr(evidence_module, "seal_digest", counting)
    return calls


def test_without_evidence_an_attempt_is_sealed_only_when_its_digest_is_read(
    tmp_path: Path, sealed: list[str]
) -> None:
    lake = make_lake(tmp_path)
    with make_service(tmp_path, evidence_dir=None) as service:
        first = service.execute(Scan(lake.facts, columns=("amount",))).diagnostics
        second = service.execute(Scan(lake.facts, columns=("region",))).diagnostics
        assert sealed == []  # neither query serialised its evidence document
        (a,), (b,) = first.attempts, second.attempts
        seen: list[str] = []
        threads = [
            threading.Thread(target=lambda: seen.append(a.evidence_digest)) for _ in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(seen)) == 1
        assert re.fullmatch(r"[0-9a-f]{64}", seen[0])
        assert sealed == [a.attempt_id]  # once, however many read it
        assert a.to_dict()["evidence_digest"] == seen[0]
        assert b.evidence_digest != a.evidence_digest  # each document its own seal
        assert sealed == [a.attempt_id, b.attempt_id]


def test_an_unread_digest_survives_pickle_and_copies(tmp_path: Path, sealed: list[str]) -> None:
    lake = make_lake(tmp_path)
    with make_service(tmp_path, evidence_dir=None) as service:
        diagnostics = service.execute(Scan(lake.facts)).diagnostics
    again = pickle.loads(pickle.dumps(diagnostics.attempts[0]))
    assert isinstance(again.__dict__["_evidence_digest"], str)  # the digest, no function
    assert again == diagnostics.attempts[0]
    assert copy.deepcopy(diagnostics).attempts[0].evidence_digest == again.evidence_digest
    assert pickle.loads(pickle.dumps(diagnostics)).attempts == diagnostics.attempts
    assert len(sealed) == 1


def test_with_evidence_the_digest_is_the_documents_seal_before_execute_returns(
    tmp_path: Path, sealed: list[str]
) -> None:
    lake = make_lake(tmp_path)
    with make_service(tmp_path) as service:
        diagnostics = service.execute(Scan(lake.facts, columns=("amount",))).diagnostics
        (record,) = diagnostics.attempts
        assert sealed == [record.attempt_id]
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "evidence").glob("attempt-*")]
    assert doc["seal"]["digest"] == record.evidence_digest
    assert isinstance(record.__dict__["_evidence_digest"], str)
