"""``nexus-cache program-cache ...`` through the real entry point."""

from __future__ import annotations

import hashlib
import os

import pytest

from nexus_cache.cli.main import main
from nexus_cache.cli.program import parse_size
from nexus_cache.program import FileStreamProgramCache, SQLiteProgramCache


def fs_cache(tmp_path):
    c = FileStreamProgramCache(tmp_path / "fs")
    c.update({b"a": b"x" * 100, b"b": b"y" * 2000, b"c": b"z" * 300})
    return c


def sqlite_cache(tmp_path):
    c = SQLiteProgramCache(tmp_path / "db.sqlite")
    c.update({b"a": b"x" * 100, b"b": b"y" * 2000, b"c": b"z" * 300})
    c.close()
    return c


@pytest.fixture(params=["filestream", "sqlite"])
def setup(request, tmp_path):
    if request.param == "filestream":
        c = fs_cache(tmp_path)
        return ["--backend", "filestream", "--path", str(c.path)], c
    c = sqlite_cache(tmp_path)
    return ["--backend", "sqlite", "--path", str(c.path)], c


def run(capsys, *argv):
    rc = main(["program-cache", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_info(setup, capsys):
    opts, _ = setup
    rc, out, _ = run(capsys, "info", *opts)
    assert rc == 0
    assert "entries: 3" in out
    assert "bytes:   2400 (2.3 KiB)" in out


def test_ls_lists_lru_first(setup, capsys):
    opts, _ = setup
    rc, out, _ = run(capsys, "ls", *opts)
    assert rc == 0
    lines = [ln for ln in out.splitlines() if not ln.startswith("#")]
    assert [ln.split("\t")[1] for ln in lines] == ["100", "2000", "300"]
    rc, out, _ = run(capsys, "ls", *opts, "--limit", "1")
    assert len([ln for ln in out.splitlines() if not ln.startswith("#")]) == 1


def test_prune_and_clear(setup, capsys):
    opts, _ = setup
    rc, out, _ = run(capsys, "prune", *opts, "--max-bytes", "2300")
    assert rc == 0
    assert out.startswith("removed 1 entries (100 B); 2.2 KiB remain")
    rc, out, _ = run(capsys, "clear", *opts)
    assert rc == 0
    assert out.startswith("removed 2 entries")
    rc, out, _ = run(capsys, "info", *opts)
    assert "entries: 0" in out


def test_verify_clean_exits_zero(setup, capsys):
    opts, _ = setup
    rc, out, _ = run(capsys, "verify", *opts)
    assert rc == 0
    assert "checked 3: 3 ok, 0 corrupt" in out


def test_verify_reports_and_removes_corrupt_filestream(tmp_path, capsys):
    c = fs_cache(tmp_path)
    h = hashlib.sha256(b"b").hexdigest()
    with open(c.path / "entries" / h[:2] / h, "r+b") as f:
        f.write(b"Y")
    rc, out, _ = run(capsys, "verify", "--path", str(c.path))
    assert rc == 1
    assert f"corrupt, removed: {h}" in out
    assert "checked 3: 2 ok, 1 corrupt (removed)" in out
    assert c.get(b"b") is None
    rc, out, _ = run(capsys, "verify", "--path", str(c.path))
    assert rc == 0


def test_verify_reports_refused_symlink(tmp_path, capsys):
    c = fs_cache(tmp_path)
    h = hashlib.sha256(b"a").hexdigest()
    p = c.path / "entries" / h[:2] / h
    os.unlink(p)
    p.symlink_to(tmp_path)
    rc, out, _ = run(capsys, "verify", "--path", str(c.path))
    assert rc == 1
    assert f"refused (symbolic link), left in place: {p}" in out


def test_missing_cache_is_not_created(tmp_path, capsys):
    for action in ("info", "ls", "verify", "clear"):
        rc, out, _ = run(capsys, action, "--path", str(tmp_path / "none"))
        assert rc == 0
        assert "no filestream program cache at" in out
    assert not (tmp_path / "none").exists()


def test_default_location_from_env(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(tmp_path / "fs"))
    fs_cache(tmp_path)
    rc, out, _ = run(capsys, "info")
    assert rc == 0
    assert f"path:    {tmp_path / 'fs'}" in out


def test_security_error_is_one_clean_line(tmp_path, capsys):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    rc, _, err = run(capsys, "info", "--path", str(tmp_path / "link"))
    assert rc == 2
    assert err.startswith("nexus-cache: error:")
    assert "symbolic link" in err


def test_bad_max_bytes(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["program-cache", "prune", "--path", str(tmp_path), "--max-bytes", "-5"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "'-5'" in err
    assert "byte size" in err


@pytest.mark.parametrize(
    ("text", "value"),
    [("0", 0), ("1048576", 1 << 20), ("512K", 512 << 10), ("64MiB", 64 << 20), ("2g", 2 << 30)],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


def test_demo_delegates_to_run_demo(tmp_path, monkeypatch):
    import nexus_cache.program._demo as demo

    calls = []
    monkeypatch.setattr(demo, "run_demo", lambda path, arch: calls.append((path, arch)) or 0)
    assert main(["program-cache", "demo", "--path", str(tmp_path), "--arch", "sm_80"]) == 0
    assert calls == [(str(tmp_path), "sm_80")]
