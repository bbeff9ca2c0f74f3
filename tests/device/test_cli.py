"""``nexus-cache device report`` on the host backend."""

from __future__ import annotations

import json

import pytest

from nexus_cache.cli.main import main
from nexus_cache.device import REPORT_COLUMNS


def test_report_json_host(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["device", "report", "--backend", "host", "--cache-cap-bytes", "4K", "--json"]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1
    row = rows[0]
    assert list(row) == list(REPORT_COLUMNS)
    assert row["backend"] == "host"
    assert row["cache_cap_bytes"] == 4096
    assert row["caches_installed"] is True
    assert row["cache_evictable_resident_bytes"] == 0


def test_report_default_is_a_readable_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["device", "report", "--backend", "host", "--demo"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "DEVICE" in line)
    assert header.split()[:3] == ["DEVICE", "BACKEND", "CACHE"]
    row = next(line for line in out.splitlines() if line.split()[:2] == ["0", "host"])
    assert "1.0 MiB" in row  # the pinned demo entry, in IEC units
    assert "64.0 KiB" in row  # the evictable one
    assert "open" in row
    assert "{" not in out


def test_report_all_lists_every_field_per_device(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["device", "report", "--backend", "host", "--all"]) == 0
    out = capsys.readouterr().out
    for column in REPORT_COLUMNS:
        field = column
        for prefix in ("domain_", "source_", "graph_"):
            field = field.removeprefix(prefix)
        assert f" {field} " in out, column


def test_report_tsv_demo_shows_pinned_and_evictable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["device", "report", "--backend", "host", "--format", "tsv", "--demo"]) == 0
    header, line = capsys.readouterr().out.splitlines()
    row = dict(zip(header.split("\t"), line.split("\t"), strict=True))
    assert row["cache_pinned_in_use_bytes"] == str(1 << 20)
    assert row["cache_evictable_resident_bytes"] == str(64 << 10)
    assert row["domain_used_bytes"] == str((1 << 20) + (64 << 10))
    assert row["drift_bytes"] == "0"
    assert row["admission_open"] == "true"


def test_report_prometheus(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("prometheus_client")
    assert main(["device", "report", "--backend", "host", "--format", "prometheus"]) == 0
    out = capsys.readouterr().out
    assert 'nexus_gpu_cache_pinned_in_use_bytes{device="0"} 0.0' in out


def test_report_zero_cap_has_empty_domain_cells(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["device", "report", "--backend", "host", "--format", "tsv", "--cache-cap-bytes", "0"]
    assert main(args) == 0
    header, line = capsys.readouterr().out.splitlines()
    row = dict(zip(header.split("\t"), line.split("\t"), strict=True))
    assert row["caches_installed"] == "false"
    assert row["domain_used_bytes"] == ""


def test_bad_backend_env_is_one_clean_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NEXUS_DEVICE_BACKEND", "gpu")
    assert main(["device", "report"]) == 2
    err = capsys.readouterr().err
    assert "NEXUS_DEVICE_BACKEND='gpu'" in err
    assert "auto, cuda, host" in err


def test_cap_above_capacity_is_config_error(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["device", "report", "--backend", "host", "--cache-cap-bytes", str(1 << 50)]
    assert main(args) == 2
    assert "lower the cap" in capsys.readouterr().err
