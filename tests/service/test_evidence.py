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


def docs_digest(path: Path, docs: list[tuple[Path, dict]]) -> str:  # type: ignore[type-arg]
    return next(doc["seal"]["digest"] for p, doc in docs if p == path)


def test_every_attempt_is_sealed_and_verifies(evidence: Path) -> None:
    docs = _docs(evidence)
    assert len(docs) == 4
    for _, doc in docs:
        assert doc["format"] == EVIDENCE_FORMAT
        assert doc["seal"]["digest"] == seal_digest(doc)
        assert set(doc["statuses"]) == {"lakehouse", "source_cache", "graph_cache", "table"}
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
    assert set(report.problems) == {
        (first.name, "missing: admission.tsv line 2 logs this attempt, but its document is gone"),
        (
            next(p.name for p, d in docs if d["previous_digest"] == docs_digest(first, docs)),
            "chain broken: the previous attempt's evidence is missing or was changed",
        ),
    }


def test_unreadable_document_and_missing_directory(tmp_path: Path, evidence: Path) -> None:
    (evidence / "attempt-bad.json").write_text("{not json")
    report = verify_evidence(evidence)
    assert [name for name, _ in report.problems] == ["attempt-bad.json"]
    with pytest.raises(FileNotFoundError):
        verify_evidence(tmp_path / "nowhere")
    assert main(["evidence", "verify", str(tmp_path / "nowhere")]) != 0


def test_swapped_documents_are_detected(evidence: Path) -> None:
    (a, _), (b, _) = _docs(evidence)[:2]
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)  # both seals and the chain still hold; the names do not
    b.write_bytes(data_a)
    problems = dict(verify_evidence(evidence).problems)
    assert "renamed" in problems[a.name]
    assert "renamed" in problems[b.name]


def test_a_forged_branch_of_the_chain_is_detected(evidence: Path) -> None:
    docs = _docs(evidence)
    _, linked = next((p, d) for p, d in docs if d["previous_digest"] is not None)
    forged = {k: v for k, v in linked.items() if k != "seal"}
    forged["attempt_id"] = "feedfeedfeedfeed-1"
    forged["query_id"] = "feedfeedfeedfeed"
    forged["seal"] = {"algorithm": "sha256", "digest": seal_digest(forged)}
    (evidence / "attempt-feedfeedfeedfeed-1.json").write_text(json.dumps(forged))
    problems = dict(verify_evidence(evidence).problems)
    assert "chain fork" in problems["attempt-feedfeedfeedfeed-1.json"]
    original = [n for n, p in problems.items() if n != "attempt-feedfeedfeedfeed-1.json"]
    assert len(original) == 1
    assert "chain fork" in problems[original[0]]


def _tsv(evidence: Path) -> Path:
    return evidence / "admission.tsv"


def test_admission_tsv_cut_or_lines_removed(evidence: Path) -> None:
    tsv = _tsv(evidence)
    original = tsv.read_text()
    lines = original.splitlines(keepends=True)
    assert len(lines) == 5  # header and one line per attempt
    tsv.write_text(original[:-10])  # cut inside the last line
    problems = verify_evidence(evidence).problems
    assert ("admission.tsv", "the last line is cut (no line end)") in problems
    tsv.write_text("".join(lines[:-1]))  # the last attempt's line removed cleanly
    problems = dict(verify_evidence(evidence).problems)
    assert set(problems) == {f"attempt-{lines[-1].split(chr(9))[2]}.json"}
    assert "no line in admission.tsv" in next(iter(problems.values()))
    tsv.write_text("".join(lines[1:]))  # header removed
    problems = verify_evidence(evidence).problems
    assert problems == (("admission.tsv", "the header line is missing or changed"),)
    tsv.write_text(original.replace("\tadmitted\t", "\tadmitted\textra\t", 1))
    assert "fields" in dict(verify_evidence(evidence).problems)["admission.tsv"]
    tsv.unlink()
    assert dict(verify_evidence(evidence).problems) == {
        "admission.tsv": "missing, but attempt documents exist"
    }
    tsv.write_text(original)
    assert verify_evidence(evidence).ok


def test_verify_of_a_missing_or_file_location_exits_2(
    tmp_path: Path, evidence: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(NotADirectoryError):
        verify_evidence(_tsv(evidence))
    for target in (tmp_path / "nowhere", _tsv(evidence)):
        capsys.readouterr()
        assert main(["evidence", "verify", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert ("is not a directory" in err) == (target.name == "admission.tsv")


def test_a_directory_without_evidence_or_an_empty_dir_exits_2(
    tmp_path: Path,
    evidence: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # "0 verified, 0 failed" and exit 0 for a wrong directory, or one whose
    # evidence was removed entirely, read as a passed check.
    other = tmp_path / "not-evidence"
    other.mkdir()
    (other / "notes.txt").write_text("unrelated")
    with pytest.raises(FileNotFoundError, match="holds no evidence"):
        verify_evidence(other)
    assert main(["evidence", "verify", str(other)]) == 2
    assert "holds no evidence" in capsys.readouterr().err
    monkeypatch.chdir(evidence)  # "" would have verified the working directory
    assert main(["evidence", "verify", ""]) == 2
    assert "DIR is empty" in capsys.readouterr().err
    # a service that has run no query yet leaves admission.tsv alone: that verifies
    fresh = tmp_path / "fresh"
    make_service(tmp_path / "svc", evidence_dir=fresh).shutdown()
    assert sorted(p.name for p in fresh.iterdir()) == ["admission.tsv"]
    assert verify_evidence(fresh).ok


def test_admission_tsv_header_comes_first_when_services_race(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from nexus_cache.service.evidence import ADMISSION_COLUMNS, AdmissionLog

    directory = tmp_path / "evidence"
    directory.mkdir(mode=0o700)
    tsv = directory / "admission.tsv"
    other = AdmissionLog(tmp_path / "elsewhere")
    other._path = tsv  # another service appending to the same file
    line = {"query_id": "q", "attempt_id": "q-1", "decision": "admitted"}
    real_open = os.open
    fired = []

    def racing_open(path, flags, *args):  # type: ignore[no-untyped-def]
        fd = real_open(path, flags, *args)
        if not fired and not flags & os.O_APPEND and tsv.exists():
            # the other service appends the moment the file is visible
            fired.append(True)
            other.record(line)
        return fd

    monkeypatch.setattr(os, "open", racing_open)
    AdmissionLog(directory)
    monkeypatch.setattr(os, "open", real_open)
    if not fired:  # no window to race in: the other service appends afterwards
        other.record(line)
    lines = tsv.read_text().splitlines()
    # the header first, and the other service's line kept (not overwritten by it)
    assert lines[0].split("\t") == list(ADMISSION_COLUMNS)
    assert [row.split("\t")[2] for row in lines[1:]] == ["q-1"]


def test_a_foreign_document_with_its_own_seal_is_detected(evidence: Path) -> None:
    _, doc = _docs(evidence)[0]
    forged = {k: v for k, v in doc.items() if k != "seal"}
    forged.update(attempt_id="0000000000000000-1", query_id="0000000000000000")
    forged["previous_digest"] = None  # the start of a chain of its own
    forged["seal"] = {"algorithm": "sha256", "digest": seal_digest(forged)}
    (evidence / "attempt-0000000000000000-1.json").write_text(json.dumps(forged))
    (evidence / "notes.txt").write_text("not evidence; ignored")
    report = verify_evidence(evidence)
    assert report.problems == (
        ("attempt-0000000000000000-1.json", "no line in admission.tsv for its attempt"),
    )


def test_an_edited_admission_line_is_detected(evidence: Path) -> None:
    tsv = _tsv(evidence)
    header, first, *rest = tsv.read_text().splitlines(keepends=True)
    fields = first.split("\t")
    fields[5] = str(int(fields[5]) * 2)  # requested_bytes
    tsv.write_text(header + "\t".join(fields) + "".join(rest))
    problems = dict(verify_evidence(evidence).problems)
    assert list(problems) == [f"attempt-{fields[2]}.json"]
    assert "line disagrees" in problems[f"attempt-{fields[2]}.json"]


def test_hostile_documents_are_reported_not_raised(
    evidence: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # verify never raises for a bad document: json's RecursionError on deep
    # nesting and a sealed list previous_digest (unhashable) escaped it.
    _, doc = _docs(evidence)[0]
    forged = {k: v for k, v in doc.items() if k != "seal"}
    forged.update(attempt_id="1111111111111111-1", query_id="1111111111111111")
    forged["previous_digest"] = ["not", "a", "digest"]
    forged["seal"] = {"algorithm": "sha256", "digest": seal_digest(forged)}
    (evidence / "attempt-1111111111111111-1.json").write_text(json.dumps(forged))
    deep = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    (evidence / "attempt-2222222222222222-1.json").write_bytes(deep)
    problems = dict(verify_evidence(evidence).problems)
    assert set(problems) == {"attempt-1111111111111111-1.json", "attempt-2222222222222222-1.json"}
    assert "malformed previous_digest" in problems["attempt-1111111111111111-1.json"]
    assert "unreadable" in problems["attempt-2222222222222222-1.json"]
    assert main(["evidence", "verify", str(evidence)]) == 1
    assert "error" not in capsys.readouterr().err


def test_fifos_named_like_evidence_are_reported_not_waited_on(evidence: Path) -> None:
    # read_bytes() on a FIFO blocks forever: the verifier hung.
    import os
    import subprocess
    import sys

    (evidence / "attempt-3333333333333333-1.json").unlink(missing_ok=True)
    os.mkfifo(evidence / "attempt-3333333333333333-1.json")
    tsv = _tsv(evidence)
    tsv.unlink()
    os.mkfifo(tsv)
    run = subprocess.run(
        [sys.executable, "-m", "nexus_cache.cli.main", "evidence", "verify", str(evidence)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 1, run.stderr.decode()
    out = run.stdout.decode()
    assert "attempt-3333333333333333-1.json" in out
    assert "not a regular file" in out


def _newest_first(evidence: Path) -> list[Path]:
    """The documents, newest TSV line first."""
    lines = _tsv(evidence).read_text().splitlines()[1:]
    return [evidence / f"attempt-{line.split(chr(9))[2]}.json" for line in reversed(lines)]


def test_deleting_the_newest_documents_is_detected(
    evidence: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No document links to the newest ones: only the TSV still names them.
    newest, second, *_ = _newest_first(evidence)
    newest.unlink()
    second.unlink()
    report = verify_evidence(evidence)
    assert not report.ok
    assert [name for name, _ in report.problems] == [second.name]
    assert (
        "admission.tsv line 4 logs this attempt, but its document is gone"
        in (report.problems[0][1])
    )
    assert [name for name, _ in report.warnings] == [newest.name]
    capsys.readouterr()
    assert main(["evidence", "verify", str(evidence)]) == 1
    out = capsys.readouterr().out
    assert second.name in out
    assert "2 verified, 1 failed, 1 warnings" in out


def test_the_newest_line_without_its_document_is_a_warning(
    evidence: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A service killed between admitting an attempt and sealing it leaves this.
    newest = _newest_first(evidence)[0]
    newest.unlink()
    report = verify_evidence(evidence)
    assert report.ok
    assert len(report.verified) == 3
    assert [name for name, _ in report.warnings] == [newest.name]
    assert "newest admission.tsv line (5)" in report.warnings[0][1]
    capsys.readouterr()
    assert main(["evidence", "verify", str(evidence), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True
    assert [w["file"] for w in data["warnings"]] == [newest.name]


def test_closed_admissions_need_no_document(evidence: Path) -> None:
    tsv = _tsv(evidence)
    header, first, *rest = tsv.read_text().splitlines(keepends=True)
    fields = first.split("\t")
    fields[2], fields[4] = "abababababababab-1", "closed"
    tsv.write_text(header + "\t".join(fields) + first + "".join(rest))
    assert verify_evidence(evidence).ok
    assert verify_evidence(evidence).warnings == ()


def test_a_huge_document_is_reported_not_read(
    evidence: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 200 MB (sparse: no disk used); read whole it cost 1 GB of memory
    huge = evidence / "attempt-4444444444444444-1.json"
    with huge.open("wb") as f:
        f.truncate(200 << 20)
    problems = dict(verify_evidence(evidence).problems)
    assert problems == {
        huge.name: "too large: 209715200 bytes, over the limit of 16777216 bytes per "
        "document (max_document_bytes); not read"
    }
    small = dict(verify_evidence(evidence, max_document_bytes=100).problems)
    assert len(small) == 5  # every real document is over 100 bytes
    capsys.readouterr()
    assert main(["evidence", "verify", str(evidence), "--max-document-bytes", "1MiB"]) == 1
    assert "over the limit of 1048576 bytes" in capsys.readouterr().out
    with pytest.raises(SystemExit) as usage:
        main(["evidence", "verify", str(evidence), "--max-document-bytes", "0"])
    assert usage.value.code == 2


def test_verify_memory_stays_bounded(evidence: Path) -> None:
    import subprocess
    import sys

    with (evidence / "attempt-5555555555555555-1.json").open("wb") as f:
        f.truncate(200 << 20)
    with _tsv(evidence).open("ab") as f:  # one 100 MB "line"
        f.truncate(_tsv(evidence).stat().st_size + (100 << 20))
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent (pytest)
    code = (
        "import re, sys\n"
        "from nexus_cache.service import verify_evidence\n"
        "r = verify_evidence(sys.argv[1])\n"
        "status = open('/proc/self/status').read()\n"
        "print(re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1))\n"
        "print(sorted(p for _, p in r.problems))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(evidence)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    peak_kib, problems = run.stdout.splitlines()
    assert int(peak_kib) < 200 << 10  # under 200 MiB, documents and TSV included
    assert "longer than 65536 bytes" in problems
    assert "too large: 209715200 bytes" in problems


def test_the_cli_default_limit_is_the_library_one(capsys: pytest.CaptureFixture[str]) -> None:
    from nexus_cache.service.evidence import MAX_DOCUMENT_BYTES

    with pytest.raises(SystemExit):
        main(["evidence", "verify", "--help"])
    assert MAX_DOCUMENT_BYTES == 16 << 20
    assert "(default 16MiB)" in " ".join(capsys.readouterr().out.split())


def test_admission_log_keeps_a_bounded_tail_in_memory(tmp_path: Path) -> None:
    # a long-running server admits millions of attempts: the in-memory lines
    # must not grow with them (the file keeps every line)
    from nexus_cache.service._admission_tsv import ADMISSION_MEMORY_LINES, AdmissionLog

    log = AdmissionLog(None)
    for n in range(ADMISSION_MEMORY_LINES + 5):
        log.record({"attempt_id": f"q-{n}", "decision": "admitted"})
    assert len(log.lines) == ADMISSION_MEMORY_LINES
    assert log.lines[0]["attempt_id"] == "q-5"
    assert log.lines[-1]["attempt_id"] == f"q-{ADMISSION_MEMORY_LINES + 4}"
