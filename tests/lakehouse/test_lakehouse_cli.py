"""``nexus-cache lakehouse info|ls|verify|prune|clear``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nexus_cache.cli.main import main

from ._helpers import entry_files, make_cache, write_old_file


@pytest.fixture
def filled(tmp_path: Path) -> tuple[Path, list[str]]:
    root = tmp_path / "c"
    sources = [
        str(write_old_file(tmp_path / "remote" / f"p{i}.parquet", os.urandom(10_000 * (i + 1))))
        for i in range(3)
    ]
    with make_cache(root, policy="fill_before_read") as cache:
        for src in sources:
            cache.prefetch(src)
    return root, sources


def test_info_and_ls(filled: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    root, sources = filled
    assert main(["lakehouse", "info", "--root", str(root)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["entries"] == 3
    assert info["bytes"] == 60_000
    assert main(["lakehouse", "ls", "--root", str(root), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["location"] for r in rows) == sorted(f"file://{s}" for s in sources)
    assert main(["lakehouse", "ls", "--root", str(root)]) == 0
    table = capsys.readouterr().out
    assert "LOCATION" in table
    assert sources[0] in table


def test_root_from_env(
    filled: tuple[Path, list[str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, _ = filled
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_ROOT", str(root))
    assert main(["lakehouse", "info"]) == 0
    assert json.loads(capsys.readouterr().out)["root"] == str(root)


def test_verify_removes_mismatching_entries(
    filled: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = filled
    assert main(["lakehouse", "verify", "--root", str(root)]) == 0
    assert "3 good, 0 bad" in capsys.readouterr().out
    victim = entry_files(root)[0]
    data = bytearray(victim.read_bytes())
    data[5] ^= 1
    victim.write_bytes(bytes(data))
    assert main(["lakehouse", "verify", "--root", str(root), "--keep"]) == 1
    assert "digest" in capsys.readouterr().out
    assert victim.exists()
    assert main(["lakehouse", "verify", "--root", str(root)]) == 1
    assert "2 good, 1 bad" in capsys.readouterr().out
    assert not victim.exists()
    assert len(entry_files(root)) == 2


def test_prune_and_clear(
    filled: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, sources = filled
    assert main(["lakehouse", "prune", "--root", str(root), "--max-bytes", "35KB"]) == 0
    assert "removed" in capsys.readouterr().out
    assert sum(p.stat().st_size for p in entry_files(root)) <= 35_000
    with make_cache(root) as cache, cache.open(sources[2]) as pinned:
        assert pinned.is_local
        assert main(["lakehouse", "clear", "--root", str(root)]) == 0
        assert "1 pinned entries kept" in capsys.readouterr().out
        assert len(entry_files(root)) == 1
    assert main(["lakehouse", "clear", "--root", str(root)]) == 0
    assert entry_files(root) == []


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lakehouse", "info", "--root", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    tmp_path.joinpath("plain").mkdir()
    assert main(["lakehouse", "ls", "--root", str(tmp_path / "plain")]) == 2
    assert "not a lakehouse cache root" in capsys.readouterr().err
    assert not (tmp_path / "plain" / "entries").exists()
    assert (
        main(["lakehouse", "prune", "--root", str(tmp_path / "plain"), "--max-bytes", "10Q"]) == 2
    )
    assert "KiB" in capsys.readouterr().err
