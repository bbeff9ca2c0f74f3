"""Sealed attempt evidence: every attempt verifies; any change is detected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nexus_cache.cli.main import main
from nexus_cache.service import Count, Scan, verify_evidence
from nexus_cache.service.evidence import EVIDENCE_FORMAT, seal_digest

from ._helpers import make_lake, make_service


@pytest.fixture
def evidence(tmp_path: Path) -> Path:
    lake = make_lake(tmp_path)
    with make_service(tmp_path) as service:
        for _ in range(2):
            service.execute(Scan(lake.facts, columns=("amount",)))
            service.execute(Count(lake.facts))
    return tmp_path / "evidence"


def _docs(directory: Path) -> list[tuple[Path, dict]]:  # type: ignore[type-arg]
    return [(p, json.loads(p.read_text())) for p in sorted(directory.glob("attempt-*.json"))]


def test_every_attempt_is_sealed_and_verifies(evidence: Path) -> None:
    docs = _docs(evidence)
    assert len(docs) == 4
    for _, doc in docs:
        assert doc["format"] == EVIDENCE_FORMAT
        assert doc["seal"]["digest"] == seal_digest(doc)
        assert set(doc["statuses"]) == {"lakehouse", "source_cache", "graph_cache"}
        assert "cache_evictable_resident_bytes" in doc["ledger"]
        assert "cache_pinned_in_use_bytes" in doc["ledger"]
        assert doc["plan"]["grant_bytes"] > 0
        assert len(doc["result"]["fingerprint"]) == 64
        assert doc["timings"]["plan_s"] >= 0
    assert sum(doc["previous_digest"] is None for _, doc in docs) == 1  # one chain
    report = verify_evidence(evidence)
    assert report.ok
    assert len(report.verified) == 4
    assert main(["evidence", "verify", str(evidence)]) == 0


def test_a_modified_document_fails(evidence: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, doc = _docs(evidence)[0]
    doc["statuses"]["lakehouse"]["status"] = "hit"
    doc["result"]["rows"] += 1
    path.write_text(json.dumps(doc))
    report = verify_evidence(evidence)
    assert not report.ok
    problems = dict(report.problems)
    assert "seal mismatch" in problems.pop(path.name)
    # the attempt sealed after it (if any) links to the original digest
    assert all("chain broken" in problem for problem in problems.values())
    capsys.readouterr()
    assert main(["evidence", "verify", str(evidence), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False
    assert path.name in {p["file"] for p in out["problems"]}


def test_a_resealed_document_breaks_the_chain(evidence: Path) -> None:
    docs = _docs(evidence)
    by_digest = {doc["seal"]["digest"]: path for path, doc in docs}
    # rewrite a document that another one links to, with a fresh valid seal
    linked = next(doc["previous_digest"] for _, doc in docs if doc["previous_digest"])
    path = by_digest[linked]
    doc = json.loads(path.read_text())
    doc["outcome"] = "ok-but-edited"
    doc["seal"]["digest"] = seal_digest(doc)
    path.write_text(json.dumps(doc))
    report = verify_evidence(evidence)
    assert not report.ok
    assert any("chain broken" in problem for _, problem in report.problems)


def test_a_removed_document_breaks_the_chain(evidence: Path) -> None:
    docs = _docs(evidence)
    first = next(path for path, doc in docs if doc["previous_digest"] is None)
    first.unlink()
    report = verify_evidence(evidence)
    assert [problem for _, problem in report.problems] == [
        "chain broken: the previous attempt's evidence is missing or was changed"
    ]


def test_unreadable_document_and_missing_directory(tmp_path: Path, evidence: Path) -> None:
    (evidence / "attempt-bad.json").write_text("{not json")
    report = verify_evidence(evidence)
    assert [name for name, _ in report.problems] == ["attempt-bad.json"]
    with pytest.raises(FileNotFoundError):
        verify_evidence(tmp_path / "nowhere")
    assert main(["evidence", "verify", str(tmp_path / "nowhere")]) != 0
