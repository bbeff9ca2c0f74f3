"""What a user types, refused or accepted as the docs say (found by hand-testing the CLI)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from nexus_cache._numbers import parse_float_text, parse_int_text
from nexus_cache.cli.main import main
from nexus_cache.errors import ConfigError
from nexus_cache.lakehouse import LakehouseCacheConfig
from nexus_cache.program import FileStreamProgramCache
from nexus_cache.service import ServiceConfig

# Python's int()/float() take these; a setting must not.
ARABIC_TEN = "\u0661\u0660"  # Arabic-Indic digits one, zero
ODD_NUMBERS = [ARABIC_TEN, "1_000", "\uff11\uff10", "0x10"]  # ..., fullwidth 10


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("NEXUS_")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize("text", ODD_NUMBERS)
def test_number_text_refuses_non_ascii_digits_and_underscores(text: str) -> None:
    with pytest.raises(ValueError):
        parse_int_text(text)
    with pytest.raises(ValueError):
        parse_float_text(text)


def test_number_text_accepts_plain_ascii() -> None:
    assert parse_int_text(" 12 ") == 12
    assert parse_float_text("1.5") == 1.5
    assert parse_float_text("2e3") == 2000.0


@pytest.mark.parametrize(
    "variable",
    [
        "NEXUS_LAKEHOUSE_FILL_MAX_CONCURRENCY",
        "NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S",
        "NEXUS_LAKEHOUSE_CACHE_IDENTITY_TTL",
    ],
)
@pytest.mark.parametrize("text", ODD_NUMBERS)
def test_lakehouse_number_variables_refuse_odd_digits(variable: str, text: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        LakehouseCacheConfig.from_env({variable: text})


@pytest.mark.parametrize(
    "variable",
    [
        "NEXUS_SERVICE_ADMISSION_TIMEOUT_S",
        "NEXUS_SERVICE_MAX_ATTEMPTS",
        "NEXUS_SERVICE_GRANT_EXPANSION",
    ],
)
@pytest.mark.parametrize("text", ODD_NUMBERS)
def test_service_number_variables_refuse_odd_digits(
    variable: str, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, text)
    with pytest.raises(ConfigError, match=variable):
        ServiceConfig.load()


def test_lakehouse_info_exits_2_on_non_ascii_digits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NEXUS_LAKEHOUSE_FILL_MAX_CONCURRENCY", ARABIC_TEN)
    assert main(["lakehouse", "info", "--json"]) == 2
    assert "NEXUS_LAKEHOUSE_FILL_MAX_CONCURRENCY" in capsys.readouterr().err


def _program_cache(tmp_path: Path) -> Path:
    with FileStreamProgramCache(tmp_path / "pc") as cache:
        cache[b"a"] = b"x" * 100
    return tmp_path / "pc"


@pytest.mark.parametrize("limit", ["-1", "x", "1.5"])
def test_program_cache_ls_refuses_a_bad_limit(
    tmp_path: Path, limit: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _program_cache(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["program-cache", "ls", "--path", str(path), "--limit", limit])
    assert exc.value.code == 2
    assert "--limit" in capsys.readouterr().err


def test_program_cache_foreign_sqlite_file_is_not_called_a_program_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "other.sqlite"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE t (x)")
    con.close()
    assert main(["program-cache", "info", "--path", str(db)]) == 2
    err = capsys.readouterr().err
    assert f"{db} is a SQLite program cache" not in err
    assert "SQLite database file" in err


@pytest.mark.parametrize("variable", ["NEXUS_PROGRAM_CACHE_DIR", "NEXUS_PROGRAM_CACHE_DB"])
def test_blank_program_cache_location_counts_as_unset(
    variable: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nexus_cache.program import default_filestream_root, default_sqlite_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(variable, "   ")
    assert default_filestream_root() == tmp_path / "xdg" / "nexus-cache" / "program-cache"
    assert default_sqlite_path() == tmp_path / "xdg" / "nexus-cache" / "program-cache.sqlite"
    with FileStreamProgramCache() as cache:
        assert cache.path.is_absolute()
    assert not (tmp_path / "   ").exists()


def test_filestream_cache_refuses_cuda_cores_own_directory(tmp_path: Path) -> None:
    from nexus_cache.errors import CacheIntegrityError

    cuda_utils = pytest.importorskip("cuda.core.utils")
    theirs = cuda_utils.FileStreamProgramCache(tmp_path / "cc")
    theirs[b"k"] = b"binary"
    stale_temp = tmp_path / "cc" / "tmp" / "in-flight"
    stale_temp.write_bytes(b"partial")
    old = stale_temp.stat().st_mtime - 7 * 24 * 3600
    os.utime(stale_temp, (old, old))
    before = sorted(p.name for p in (tmp_path / "cc").rglob("*"))
    with pytest.raises(CacheIntegrityError, match=r"cuda\.core's own"):
        FileStreamProgramCache(tmp_path / "cc")
    assert sorted(p.name for p in (tmp_path / "cc").rglob("*")) == before  # nothing touched
    assert theirs[b"k"] == b"binary"


def test_sqlite_cache_on_a_directory_does_not_advise_removing_it(tmp_path: Path) -> None:
    from nexus_cache.program import SQLiteProgramCache

    path = _program_cache(tmp_path)
    with pytest.raises(IsADirectoryError) as exc:
        SQLiteProgramCache(path)
    message = str(exc.value)
    assert "is a directory" in message
    assert "remove it" not in message
    assert "NEXUS_PROGRAM_CACHE_DB" in message
    assert (path / "entries").is_dir()


@pytest.mark.parametrize("backend", ["filestream", "sqlite", "memory"])
def test_program_cache_byte_cap_reads_the_size_grammar(backend: str, tmp_path: Path) -> None:
    from nexus_cache.program import InMemoryProgramCache, SQLiteProgramCache

    def make(cap: object) -> object:
        if backend == "filestream":
            return FileStreamProgramCache(tmp_path / "fs", max_size_bytes=cap)
        if backend == "sqlite":
            return SQLiteProgramCache(tmp_path / "db.sqlite", max_size_bytes=cap)
        return InMemoryProgramCache(max_size_bytes=cap)

    cache = make("64M")
    assert cache.max_size_bytes == 64 << 20
    cache.close()
    for bad in ("1.5G", "-1", "0", "\u0661\u0660", "", float("nan")):
        with pytest.raises(ConfigError, match="max_size_bytes"):
            make(bad)


def test_program_cache_never_touches_a_lakehouse_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # program-cache verify on a lakehouse root removed every lakehouse entry as corrupt.
    from nexus_cache.errors import CacheIntegrityError
    from nexus_cache.lakehouse import LakehouseCache

    source = tmp_path / "src.bin"
    source.write_bytes(os.urandom(3000))
    past = source.stat().st_mtime - 60
    os.utime(source, (past, past))
    root = tmp_path / "lake"
    config = LakehouseCacheConfig(root=root, policy="fill_before_read", max_bytes=1 << 20)
    with LakehouseCache(config) as cache, cache.open(str(source)) as f:
        f.read()
    before = sorted(str(p) for p in root.rglob("*") if p.is_file())
    for action in (["verify"], ["clear"], ["prune", "--max-bytes", "0"], ["ls"]):
        assert main(["program-cache", *action, "--path", str(root)]) == 2
        assert "is a lakehouse cache root" in capsys.readouterr().err
    with pytest.raises(CacheIntegrityError, match="lakehouse cache root"):
        FileStreamProgramCache(root)
    assert sorted(str(p) for p in root.rglob("*") if p.is_file()) == before


@pytest.mark.parametrize("variable", ["NEXUS_DEVICE_BACKEND", "NEXUS_DEVICE_ALLOCATOR"])
def test_blank_device_variables_count_as_unset(
    variable: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(variable, "   ")
    monkeypatch.setenv("NEXUS_HOST_DEVICE_TOTAL_BYTES", "1G")
    assert main(["device", "report", "--json"]) == 0
    assert capsys.readouterr().err == ""
