"""The admission log under trouble: removed, replaced, full. No grant may leak."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from nexus_cache.device import DeviceLedger
from nexus_cache.errors import CacheSecurityError, EvidenceWriteError
from nexus_cache.service import ADMISSION_COLUMNS, Scan
from nexus_cache.service.admission import Admission
from nexus_cache.service.evidence import AdmissionLog

from ._helpers import MIB, make_lake, make_service


@pytest.fixture
def admission(tmp_path: Path) -> tuple[Admission, DeviceLedger, Path]:
    log = AdmissionLog(tmp_path / "evidence")
    assert log.path is not None
    return Admission(log, timeout_s=1.0), DeviceLedger(0, 64 * MIB, 16 * MIB), log.path


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_a_deleted_log_is_recreated_with_its_header(
    admission: tuple[Admission, DeviceLedger, Path],
) -> None:
    adm, ledger, path = admission
    path.unlink()
    grant = adm.admit(adm.request("q", 1, MIB), ledger=ledger)
    adm.release(grant, ledger=ledger)
    lines = _lines(path)
    assert lines[0].split("\t") == list(ADMISSION_COLUMNS)
    assert len(lines) == 2
    assert lines[1].split("\t")[ADMISSION_COLUMNS.index("attempt_id")] == "q-1"
    assert ledger.snapshot().grant_bytes == 0


def test_a_deleted_evidence_directory_is_recreated(
    admission: tuple[Admission, DeviceLedger, Path],
) -> None:
    adm, ledger, path = admission
    path.unlink()
    path.parent.rmdir()
    adm.release(ledger=ledger, grant=adm.admit(adm.request("q", 1, MIB), ledger=ledger))
    assert len(_lines(path)) == 2


def test_a_symlinked_log_is_refused_and_its_target_untouched(
    admission: tuple[Admission, DeviceLedger, Path], tmp_path: Path
) -> None:
    adm, ledger, path = admission
    target = tmp_path / "elsewhere.txt"
    target.write_text("precious\n")
    path.unlink()
    path.symlink_to(target)
    with pytest.raises(CacheSecurityError) as info:
        adm.admit(adm.request("q", 1, MIB), ledger=ledger)
    assert str(path) in str(info.value)
    assert "symlink" in str(info.value)
    assert target.read_text() == "precious\n"
    assert ledger.snapshot().grant_bytes == 0
    assert ledger.snapshot().grant_count == 0
    assert adm.log.lines == []


def test_a_directory_in_place_of_the_log_releases_the_grant(
    admission: tuple[Admission, DeviceLedger, Path],
) -> None:
    adm, ledger, path = admission
    path.unlink()
    path.mkdir()
    for number in range(20):  # each would have leaked a MiB-sized grant
        with pytest.raises(EvidenceWriteError) as info:
            adm.admit(adm.request("q", number, 4 * MIB), ledger=ledger)
        assert str(path) in str(info.value)
    assert ledger.snapshot().grant_bytes == 0
    path.rmdir()
    adm.release(
        ledger=ledger, grant=adm.admit(adm.request("q", 99, 60 * MIB), ledger=ledger)
    )  # the device is whole


def test_a_fifo_in_place_of_the_log_fails_at_once(
    admission: tuple[Admission, DeviceLedger, Path],
) -> None:
    adm, ledger, path = admission
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(EvidenceWriteError, match="admission log"):
        adm.admit(adm.request("q", 1, MIB), ledger=ledger)  # never blocks waiting for a reader
    assert ledger.snapshot().grant_bytes == 0


def _fail_writes_to(path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """Make ``os.write`` to ``path`` raise ``error`` (the rest writes as usual)."""
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") == str(path):
            raise error
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


def test_a_full_disk_is_one_clear_error_and_releases_the_grant(
    admission: tuple[Admission, DeviceLedger, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    adm, ledger, path = admission
    _fail_writes_to(path, monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(EvidenceWriteError) as info:
        adm.admit(adm.request("q", 1, MIB), ledger=ledger)
    message = str(info.value)
    assert "disk is full" in message
    assert str(path) in message
    assert "NEXUS_SERVICE_EVIDENCE_DIR" in message
    assert info.value.errno == errno.ENOSPC
    assert ledger.snapshot().grant_bytes == 0


def test_an_interrupt_while_logging_releases_the_grant(
    admission: tuple[Admission, DeviceLedger, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    adm, ledger, path = admission
    _fail_writes_to(path, monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        adm.admit(adm.request("q", 1, MIB), ledger=ledger)
    assert ledger.snapshot().grant_count == 0


def test_the_service_keeps_serving_after_the_log_was_replaced(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    with make_service(tmp_path, total=64 * MIB, cache_cap_bytes=MIB) as service:
        path = service.admission_log.path
        assert path is not None
        path.unlink()
        path.mkdir()
        for _ in range(3):
            with pytest.raises(EvidenceWriteError):
                service.execute(Scan(lake.facts))
        assert service.caches.ledger(0).snapshot().grant_bytes == 0
        path.rmdir()
        result = service.execute(Scan(lake.facts))
        assert result.table.num_rows == 4000
        assert len(_lines(path)) == 2  # recreated: header and this query's line
