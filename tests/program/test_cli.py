"""``nexus-cache program-cache ...`` through the real entry point."""

from __future__ import annotations

import json
import os
import re

import pytest

from nexus_cache.cli._output import size_option
from nexus_cache.cli.main import main
from nexus_cache.program import FileStreamProgramCache, SQLiteProgramCache
from nexus_cache.program._integrity import entry_name, entry_relpath


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
    assert "entries" in out
    assert "2.3 KiB" in out
    rc, out, _ = run(capsys, "info", *opts, "--json")
    info = json.loads(out)
    assert (info["entries"], info["bytes"]) == (3, 2400)


def test_ls_lists_lru_first(setup, capsys):
    opts, _ = setup
    rc, out, _ = run(capsys, "ls", *opts, "--json")
    assert rc == 0
    rows = json.loads(out)
    assert [r["size"] for r in rows] == [100, 2000, 300]
    assert all(r["last_access"].endswith("Z") for r in rows)
    assert all(r["program"] is None for r in rows)  # stored without a sidecar
    rc, out, _ = run(capsys, "ls", *opts, "--limit", "1", "--json")
    assert len(json.loads(out)) == 1
    rc, out, _ = run(capsys, "ls", *opts)
    assert "100 B" in out
    assert "2.0 KiB" in out
    assert "(no name recorded)" in out
    assert "programs: 3" in out


def test_ls_leaves_the_lru_order_alone(tmp_path, capsys):
    """Listing reads every entry without stamping it: the kernel's relatime
    must not make entries never read look just read (newer than the one
    really read), or the next eviction would remove that one first."""
    c = FileStreamProgramCache(tmp_path / "fs")
    c.update({b"a": b"x" * 1000, b"b": b"y" * 1000, b"c": b"z" * 1000})
    assert c.get(b"a") == b"x" * 1000  # a is now the most recently used
    entries = c.path / "entries"
    before = [(e.name, e.atime_ns) for e in c.iter_entries()]  # flushes a's stamp
    assert before[-1][0] == entry_name(b"a")
    times = {p: p.stat().st_atime_ns for p in entries.rglob("*") if p.is_file()}
    for argv in (["ls"], ["ls", "--json"], ["verify"], ["info"]):
        rc, _, _ = run(capsys, *argv, "--path", str(c.path))
        assert rc == 0
        assert {p: p.stat().st_atime_ns for p in times} == times, argv
    assert [(e.name, e.atime_ns) for e in c.iter_entries()] == before
    rc, _, _ = run(capsys, "prune", "--path", str(c.path), "--max-bytes", "1000")
    assert rc == 0
    assert c.get(b"a") == b"x" * 1000
    assert (c.get(b"b"), c.get(b"c"), len(c)) == (None, None, 1)


def test_prune_and_clear(setup, capsys):
    opts, _ = setup
    rc, out, _ = run(capsys, "prune", *opts, "--max-bytes", "2300")
    assert rc == 0
    assert out.startswith("removed 1 entries (100 B); 2.2 KiB remain")
    rc, out, _ = run(capsys, "clear", *opts)
    assert rc == 0
    assert out.startswith("removed 2 entries")
    rc, out, _ = run(capsys, "info", *opts, "--json")
    assert json.loads(out)["entries"] == 0


def test_verify_clean_exits_zero(setup, capsys):
    opts, _ = setup
    rc, out, _ = run(capsys, "verify", *opts)
    assert rc == 0
    assert "checked 3: 3 ok, 0 corrupt" in out


def test_verify_reports_and_removes_corrupt_filestream(tmp_path, capsys):
    c = fs_cache(tmp_path)
    h = entry_name(b"b")
    with open(c.path / "entries" / entry_relpath(h), "r+b") as f:
        f.write(b"Y")
    rc, out, _ = run(capsys, "verify", "--path", str(c.path))
    assert rc == 1
    assert re.search(rf"corrupt +removed +{h}", out)
    assert "checked 3: 2 ok, 1 corrupt (removed)" in out
    assert c.get(b"b") is None
    rc, out, _ = run(capsys, "verify", "--path", str(c.path))
    assert rc == 0


def test_verify_reports_refused_symlink(tmp_path, capsys):
    c = fs_cache(tmp_path)
    h = entry_name(b"a")
    p = c.path / "entries" / entry_relpath(h)
    os.unlink(p)
    p.symlink_to(tmp_path)
    rc, out, _ = run(capsys, "verify", "--path", str(c.path))
    assert rc == 1
    rc, out, _ = run(capsys, "verify", "--path", str(c.path), "--json")
    assert rc == 1
    assert json.loads(out)["refused"] == [{"path": str(p), "why": "symbolic link"}]


def test_missing_cache_exits_2_and_is_not_created(tmp_path, capsys):
    for action in ("info", "ls", "verify", "clear"):
        rc, _, err = run(capsys, action, "--path", str(tmp_path / "none"))
        assert rc == 2
        assert "no filestream program cache at" in err
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("backend", ["filestream", "sqlite"])
def test_a_cache_path_under_a_regular_file_is_missing_not_a_failure(tmp_path, capsys, backend):
    (tmp_path / "file").write_bytes(b"x")
    where = tmp_path / "file" / "cache"
    for action in ("info", "ls", "verify", "clear"):
        rc, _, err = run(capsys, action, "--backend", backend, "--path", str(where))
        assert rc == 2, err
        assert f"no {backend} program cache at {where}" in err
    assert (tmp_path / "file").read_bytes() == b"x"


def test_sqlite_file_without_backend_suggests_it(tmp_path, capsys):
    c = sqlite_cache(tmp_path)
    rc, _, err = run(capsys, "info", "--path", str(c.path))
    assert rc == 2
    assert "is a SQLite database file" in err
    assert "add --backend sqlite" in err
    assert c.path.is_file()


def test_cuda_core_cache_directory_is_named(tmp_path, capsys):
    fs = pytest.importorskip("cuda.core.utils")
    cache = fs.FileStreamProgramCache(tmp_path / "cc")
    cache[b"k"] = b"binary"
    rc, _, err = run(capsys, "ls", "--path", str(tmp_path / "cc"))
    assert rc == 2
    assert "cuda.core's own FileStreamProgramCache directory" in err


def test_default_location_from_env(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(tmp_path / "fs"))
    fs_cache(tmp_path)
    rc, out, _ = run(capsys, "info", "--json")
    assert rc == 0
    assert json.loads(out)["path"] == str(tmp_path / "fs")


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
def test_max_bytes_option_parses_sizes(text, value):
    assert size_option("--max-bytes")(text) == value


def test_demo_delegates_to_run_demo(tmp_path, monkeypatch):
    import nexus_cache.program as program

    calls = []
    monkeypatch.setattr(program, "run_demo", lambda path, arch: calls.append((path, arch)) or 0)
    assert main(["program-cache", "demo", "--path", str(tmp_path), "--arch", "sm_80"]) == 0
    assert main(["program-cache", "demo", "--arch", "sm_90a"]) == 0
    assert calls == [(str(tmp_path), "sm_80"), (None, "sm_90a")]


def test_demo_bad_arch_is_one_usage_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["program-cache", "demo", "--arch", "bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "'bogus' is not a CUDA architecture" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("backend", ["filestream", "sqlite"])
def test_ls_names_programs_from_their_sidecar(tmp_path, capsys, backend):
    """A real NVRTC compile (no GPU needed): ls shows name, symbols, code type and arch."""
    pytest.importorskip("cuda.core")
    from cuda.core import ProgramOptions

    from nexus_cache.program import CompileInputs, cached_compile

    source = "template <typename T> __global__ void axpy(T a, T *y) { y[0] += a; }"
    path = tmp_path / ("fs" if backend == "filestream" else "db.sqlite")
    cache = FileStreamProgramCache(path) if backend == "filestream" else SQLiteProgramCache(path)
    with cache:
        inputs = CompileInputs(source, "c++", ProgramOptions(arch="sm_80", name="axpy_prog"))
        cached_compile(inputs, "cubin", cache=cache, name_expressions=("axpy<float>",))
        cache[b"raw"] = b"not a cubin"
        # deep enough that json raises RecursionError: listed as an unknown binary
        cache[b"deep"] = b"{" + b'"a":' + b"[" * 100_000
    rc, out, _ = run(capsys, "ls", "--backend", backend, "--path", str(path), "--json")
    assert rc == 0
    listed = json.loads(out)
    assert len(listed) == 3
    rows = {r["program"]: r for r in listed}
    assert set(rows) == {"axpy_prog", None}  # the sidecar itself is not listed
    row = rows["axpy_prog"]
    assert (row["code_type"], row["target"], row["symbols"]) == ("cubin", "sm_80", ["axpy<float>"])
    assert (rows[None]["code_type"], rows[None]["target"]) == (None, None)
    rc, out, _ = run(capsys, "ls", "--backend", backend, "--path", str(path))
    assert re.search(r"axpy_prog: axpy<float> +cubin +sm_80", out)


@pytest.mark.parametrize("make", [fs_cache, sqlite_cache])
def test_verify_reports_progress_once_per_entry(tmp_path, make):
    c = make(tmp_path)
    cache = FileStreamProgramCache(c.path) if make is fs_cache else SQLiteProgramCache(c.path)
    ticks = []
    with cache:
        report = cache.verify(progress=ticks.append)
    assert report.checked == 3
    assert ticks == [1, 1, 1]
