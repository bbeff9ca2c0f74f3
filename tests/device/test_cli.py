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


@pytest.mark.parametrize("cap", ["100K", "1M"])
def test_demo_with_a_cap_too_small_for_its_entries_names_the_option(
    cap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Below 1 MiB the source entry was refused by the ledger (exit 1, "retry
    # after pins release"); at 1 MiB the graph entry evicted it, and the
    # report showed no pinned entry although --demo promises one.
    args = ["device", "report", "--backend", "host", "--demo", "--cache-cap-bytes", cap]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert len(err.splitlines()) == 1
    assert "--demo" in err
    assert "--cache-cap-bytes" in err
    assert "1.1 MiB" in err  # the least it needs: 1 MiB source + 64 KiB graph entry


def test_demo_with_the_least_cap_it_needs_pins_its_source_entry(
    capsys: pytest.CaptureFixture[str],
) -> None:
    least = str((1 << 20) + (64 << 10))
    args = [
        "device",
        "report",
        "--backend",
        "host",
        "--demo",
        "--json",
        "--cache-cap-bytes",
        least,
    ]
    assert main(args) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["cache_pinned_in_use_bytes"] == 1 << 20
    assert row["cache_evictable_resident_bytes"] == 64 << 10
    assert row["source_evictions"] == 0
