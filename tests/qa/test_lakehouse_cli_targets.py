"""``nexus-cache lakehouse`` pointed at the wrong things, and at missing objects."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest

from nexus_cache.cli.main import main
from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig
from nexus_cache.program import FileStreamProgramCache


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("NEXUS_LAKEHOUSE_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    with LakehouseCache(LakehouseCacheConfig(root=path, max_bytes=1 << 20)):
        pass
    return path


def _wrong_targets(tmp_path: Path, root: Path) -> dict[str, Path]:
    empty = tmp_path / "empty"
    empty.mkdir()
    link = tmp_path / "link"
    link.symlink_to(root)
    with FileStreamProgramCache(tmp_path / "pc") as cache:
        cache[b"k"] = b"v"
    return {"empty": empty, "link": link, "program": tmp_path / "pc"}


@pytest.mark.parametrize("which", ["empty", "link", "program"])
def test_stats_refuses_what_every_other_subcommand_refuses(
    tmp_path: Path, root: Path, which: str, capsys: pytest.CaptureFixture[str]
) -> None:
    target = _wrong_targets(tmp_path, root)[which]
    assert main(["lakehouse", "ls", "--root", str(target)]) == 2
    ls_err = capsys.readouterr().err
    assert main(["lakehouse", "stats", "--root", str(target), "--json"]) == 2
    out = capsys.readouterr()
    assert out.out == ""  # no report of zero reads for a directory that is no root
    assert out.err == ls_err
    assert "[Errno" not in out.err
    assert len(out.err.strip().splitlines()) == 1


def test_stats_on_a_real_root_still_works(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lakehouse", "stats", "--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["root"] == str(root)


def test_root_option_is_named_as_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    assert main(["lakehouse", "ls", "--root", str(plain)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nexus-cache: error: --root ")
    assert "NEXUS_LAKEHOUSE_CACHE_ROOT" not in err


def test_read_of_a_missing_object_names_it_and_exits_2(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.parquet"
    for extra in ([], ["--plan"]):
        rc = main(["lakehouse", "read", "--root", str(root), *extra, str(missing)])
        assert rc == 2
        err = capsys.readouterr().err
        assert f"{missing}: no such object or file" in err
        assert len(err.strip().splitlines()) == 1


def test_verify_lists_a_symlinked_entry_and_removes_only_the_link(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "src.bin"
    source.write_bytes(os.urandom(4000))
    past = source.stat().st_mtime - 60
    os.utime(source, (past, past))
    root = tmp_path / "root"
    config = LakehouseCacheConfig(root=root, policy="fill_before_read", max_bytes=1 << 20)
    with LakehouseCache(config) as cache, cache.open(str(source)) as f:
        f.read()
    (data,) = [p for p in (root / "entries").glob("*/*") if p.suffix != ".json"]
    outside = tmp_path / "outside.bin"
    data.rename(outside)
    data.symlink_to(outside)

    assert main(["lakehouse", "verify", "--root", str(root), "--keep", "--json"]) == 1
    (bad,) = json.loads(capsys.readouterr().out)["bad"]
    assert bad["key"] == data.name
    assert "symbolic link" in bad["problem"]
    assert data.is_symlink()  # --keep: listed only

    assert main(["lakehouse", "verify", "--root", str(root)]) == 1
    assert "0 good, 1 bad" in capsys.readouterr().out
    assert not data.is_symlink()
    assert not data.exists()
    assert outside.read_bytes() == source.read_bytes()  # the target is never touched
    assert main(["lakehouse", "verify", "--root", str(root)]) == 0


def test_a_symlinked_entry_as_long_as_the_object_is_refused_not_an_error(
    tmp_path: Path,
) -> None:
    # An entry's size check is one lstat; a link whose own size (its target's
    # path length) equals the object's size passed it, and the O_NOFOLLOW open
    # then failed every read of the object with ELOOP.
    target_dir = tmp_path / "t"
    target_dir.mkdir()
    size = len(str(target_dir)) + 1 + 100
    target = target_dir / ("x" * 100)
    assert len(str(target)) == size
    source = tmp_path / "src.bin"
    source.write_bytes(os.urandom(size))
    past = source.stat().st_mtime - 60
    os.utime(source, (past, past))
    root = tmp_path / "root"
    config = LakehouseCacheConfig(root=root, policy="fill_before_read", max_bytes=1 << 20)
    with LakehouseCache(config) as cache, cache.open(str(source)) as f:
        f.read()
    (data,) = [p for p in (root / "entries").glob("*/*") if p.suffix != ".json"]
    data.rename(target)
    data.symlink_to(target)
    assert data.lstat().st_size == size

    for policy in ("disabled", "fill_before_read"):
        config = LakehouseCacheConfig(root=root, policy=policy, max_bytes=1 << 20)
        with LakehouseCache(config) as cache:
            with cache.open(str(source)) as f:
                assert f.read() == source.read_bytes()
                assert (f.diagnostics.cache_status.value, f.diagnostics.reason) == (
                    "bypass",
                    "entry_refused",
                )
            kinds = [e.kind.value for e in cache.events.events()]
            assert "entry_refused" in kinds
    assert data.is_symlink()  # left for verify, which lists it


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_ls_draws_progress_on_a_terminal_stderr_only(
    root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["lakehouse", "ls", "--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []  # stdout stays one JSON document
    assert "reading entries" in terminal.getvalue()


@pytest.mark.parametrize(
    "layout", ['{"format": "other", "version": 9}', "garbage{", '{"format": "nexus-lakehouse"']
)
@pytest.mark.parametrize("command", ["ls", "stats", "verify", "clear"])
def test_foreign_or_unreadable_layout_is_no_cache_exit_2(
    tmp_path: Path, layout: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Same rule as program-cache with a foreign SQLite database: exit 2.
    root = tmp_path / "r"
    root.mkdir()
    (root / "layout.json").write_text(layout)
    assert main(["lakehouse", command, "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "layout" in err
    assert (root / "layout.json").read_text() == layout


@pytest.mark.parametrize("which", ["dir", "device", "protocol"])
def test_read_of_something_that_is_no_object_exits_2(
    tmp_path: Path, root: Path, which: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source = {"dir": str(tmp_path), "device": os.devnull, "protocol": "bogusproto://x/y"}[which]
    for extra in ([], ["--plan"]):
        assert main(["lakehouse", "read", "--root", str(root), *extra, source]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1
        assert source in err


def test_a_root_is_never_made_of_a_program_cache_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It was adopted: the lakehouse listed and pruned the program cache's
    # entries, and program-cache verify removed the lakehouse's as corrupt.
    from nexus_cache.errors import CacheIntegrityError

    program_dir = tmp_path / "pc"
    with FileStreamProgramCache(program_dir) as cache:
        cache[b"k"] = b"compiled"
    before = sorted(str(p) for p in program_dir.rglob("*"))
    with pytest.raises(CacheIntegrityError, match=r"no lakehouse layout\.json"):
        LakehouseCache(LakehouseCacheConfig(root=program_dir, max_bytes=1 << 20))
    assert sorted(str(p) for p in program_dir.rglob("*")) == before
    with FileStreamProgramCache(program_dir) as cache:
        assert cache[b"k"] == b"compiled"


def test_a_root_is_never_made_of_a_directory_holding_other_files(tmp_path: Path) -> None:
    from nexus_cache.errors import CacheIntegrityError

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(CacheIntegrityError, match=r"notes\.txt"):
        LakehouseCache(LakehouseCacheConfig(root=tmp_path, max_bytes=1 << 20))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with LakehouseCache(LakehouseCacheConfig(root=empty, max_bytes=1 << 20)):
        pass
    assert (empty / "layout.json").is_file()
    with LakehouseCache(LakehouseCacheConfig(root=empty, max_bytes=1 << 20)):
        pass  # reopening its own root is fine


def test_read_with_a_root_that_is_another_cache_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with FileStreamProgramCache(tmp_path / "pc") as cache:
        cache[b"k"] = b"v"
    source = tmp_path / "src.bin"
    source.write_bytes(b"x" * 100)
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_POLICY", "read_through")
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_MAX_BYTES", "1G")
    assert main(["lakehouse", "read", "--root", str(tmp_path / "pc"), str(source)]) == 2
    assert "not a lakehouse cache root" in capsys.readouterr().err
