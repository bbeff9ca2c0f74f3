"""Usage errors are one line on stderr and exit 2, in every group (README: Command line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nexus_cache.cli.main import main


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["no-such-command"],
        ["program-cache", "prune", "--max-bytes", "1.5G"],
        ["program-cache", "ls", "--limit", "-3"],
        ["lakehouse", "bogus"],
        ["lakehouse", "prune", "--max-bytes", "nan"],
        ["device", "report", "--backend", "nope"],
        ["device", "report", "--cache-cap-bytes", "-1"],
        ["device", "report", "--backend", "host", "--device", "\u0660"],  # Arabic-Indic 0
        ["program-cache", "ls", "--limit", "1_0"],
        ["lakehouse", "stats", "--recent", "\uff15"],  # fullwidth 5
        ["lakehouse", "stats", "--recent", "-1"],
        # int()/float() alone take non-ASCII digits and underscores
        ["scan", "x.parquet", "--device", "\u0660"],  # Arabic-Indic 0
        ["scan", "x.parquet", "--limit", "1_0"],
        ["graph", "pagerank", "x.parquet", "--src", "s", "--dst", "d", "--device", "\uff10"],
        ["demo", "--scale", "\u0663"],  # Arabic-Indic 3
        ["demo", "--scale", "1_0"],
        ["demo", "--fact-rows", "\uff11"],  # fullwidth 1
        ["scan", "x.parquet", "--batch-rows", "\u0663"],
        ["graph", "bfs", "x.parquet", "--src", "s", "--dst", "d", "--source", "\u0663"],
        [
            "graph",
            "bfs",
            "x.parquet",
            "--src",
            "s",
            "--dst",
            "d",
            "--source",
            "0",
            "--depth-limit",
            "1_0",
        ],
        ["graph", "pagerank", "x.parquet", "--src", "s", "--dst", "d", "--alpha", "\u0660.5"],
        ["graph", "pagerank", "x.parquet", "--src", "s", "--dst", "d", "--tol", "1_0"],
        ["graph", "pagerank", "x.parquet", "--src", "s", "--dst", "d", "--max-iter", "\uff15"],
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    assert lines[0].startswith("nexus-cache")
    assert "error: " in lines[0]
    assert "--help" in lines[0]


def test_help_still_shows_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["program-cache", "prune", "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("usage: nexus-cache program-cache prune")


def test_device_report_cap_over_capacity_names_the_option_in_iec(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(["device", "report", "--backend", "host", "--cache-cap-bytes", "100T"])
    assert rc == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "--cache-cap-bytes 100.0 TiB exceeds the managed capacity" in err
    assert "GiB" in err
    assert "109951162777600" not in err


def test_an_empty_location_option_never_falls_back_to_the_default_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # "clear --path $UNSET" emptied the default cache.
    from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig
    from nexus_cache.program import FileStreamProgramCache

    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(tmp_path / "pc"))
    with FileStreamProgramCache() as cache:
        cache[b"k"] = b"v"
    root = tmp_path / "lake"
    with LakehouseCache(LakehouseCacheConfig(root=root, max_bytes=1 << 20)):
        pass
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_ROOT", str(root))
    for argv in (
        ["program-cache", "clear", "--path", ""],
        ["program-cache", "ls", "--path", "  "],
        ["lakehouse", "clear", "--root", ""],
        ["lakehouse", "info", "--root", " "],
        ["lakehouse", "read", "--root", "", str(tmp_path / "x")],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "is empty" in err
        assert len(err.strip().splitlines()) == 1
    with FileStreamProgramCache() as cache:
        assert cache[b"k"] == b"v"


def test_program_cache_json_path_is_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from nexus_cache.program import SQLiteProgramCache

    monkeypatch.chdir(tmp_path)
    SQLiteProgramCache("db.sqlite").close()
    assert (
        main(["program-cache", "info", "--backend", "sqlite", "--path", "db.sqlite", "--json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["path"] == str(tmp_path / "db.sqlite")


def test_program_cache_demo_refuses_an_empty_path_and_other_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # "--path ''" made a cache in the working directory; a lakehouse root was refused
    # only by a CacheIntegrityError (exit 1) from inside the demo.
    from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig

    monkeypatch.chdir(tmp_path)
    assert main(["program-cache", "demo", "--path", ""]) == 2
    assert "--path is empty" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    root = tmp_path / "lake"
    with LakehouseCache(LakehouseCacheConfig(root=root, max_bytes=1 << 20)):
        pass
    assert main(["program-cache", "demo", "--path", str(root)]) == 2
    assert "lakehouse cache root" in capsys.readouterr().err


def test_program_cache_demo_on_a_sqlite_file_gives_advice_the_demo_can_follow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The generic advice "add --backend sqlite" named an option the demo lacks.
    from nexus_cache.program import SQLiteProgramCache

    db = tmp_path / "c.sqlite"
    SQLiteProgramCache(db).close()
    assert main(["program-cache", "demo", "--path", str(db)]) == 2
    err = capsys.readouterr().err
    assert "SQLite database file" in err
    assert "--backend" not in err
    assert "directory" in err
