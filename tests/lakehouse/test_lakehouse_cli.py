"""``nexus-cache lakehouse info|ls|verify|prune|clear``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from nexus_cache.cli.main import main

from ._helpers import entry_files, make_cache, write_old_file


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("NEXUS_LAKEHOUSE_")]:
        monkeypatch.delenv(name)


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
    assert main(["lakehouse", "info", "--root", str(root), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["entries"] == 3
    assert info["bytes"] == 60_000
    assert info["config_errors"] == []
    assert main(["lakehouse", "info", "--root", str(root)]) == 0
    table = capsys.readouterr().out
    assert "58.6 KiB" in table  # 60,000 bytes, IEC
    assert main(["lakehouse", "ls", "--root", str(root), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["location"] for r in rows) == sorted(f"file://{s}" for s in sources)
    assert all(r["last_access"].endswith("Z") for r in rows)
    assert main(["lakehouse", "ls", "--root", str(root)]) == 0
    table = capsys.readouterr().out
    assert "LOCATION" in table
    assert sources[0] in table
    assert "9.8 KiB" in table
    assert "entries: 3, 58.6 KiB" in table


def test_root_from_env(
    filled: tuple[Path, list[str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, _ = filled
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_ROOT", str(root))
    assert main(["lakehouse", "info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["root"] == str(root)


def test_blank_root_variable_counts_as_unset(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # from_env's rule: a blank value is unset (the CLI used to take "  " as a path)
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_ROOT", "   ")
    assert main(["lakehouse", "ls"]) == 2
    assert "no cache root: pass --root, set NEXUS_LAKEHOUSE_CACHE_ROOT" in capsys.readouterr().err


def test_info_reports_every_bad_variable_and_exits_2(
    filled: tuple[Path, list[str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, _ = filled
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_READ", "sometimes")
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_MAX_BYTES", "lots")
    monkeypatch.setenv("NEXUS_LAKEHOUSE_FILL_MAX_CONCURRENCY", "0")
    assert main(["lakehouse", "info", "--root", str(root), "--json"]) == 2
    out = capsys.readouterr()
    info = json.loads(out.out)
    assert info["entries"] == 3  # the root is still reported
    assert info["environment_config"] is None
    assert len(info["config_errors"]) == 3
    for name in ("CACHE_READ", "CACHE_MAX_BYTES", "FILL_MAX_CONCURRENCY"):
        assert f"NEXUS_LAKEHOUSE_{name}" in out.err
    assert out.err.count("nexus-cache: error:") == 3


def test_info_reports_a_bad_combination(
    filled: tuple[Path, list[str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, _ = filled
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_ROOT", str(root))
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_POLICY", "read_through")
    assert main(["lakehouse", "info"]) == 2
    assert "NEXUS_LAKEHOUSE_CACHE_MAX_BYTES is required" in capsys.readouterr().err


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
    assert main(["lakehouse", "verify", "--root", str(root), "--keep", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["checked"] == 3
    assert report["good"] == 2
    assert [b["key"] for b in report["bad"]] == [victim.name]
    assert "digest" in report["bad"][0]["problem"]
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
    assert "removed 2 entries (29.3 KiB); 29.3 KiB remain" in capsys.readouterr().out
    assert sum(p.stat().st_size for p in entry_files(root)) <= 35_000
    with make_cache(root) as cache, cache.open(sources[2]) as pinned:
        assert pinned.is_local
        assert main(["lakehouse", "clear", "--root", str(root), "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {"removed": 0, "pinned_kept": 1}
        assert len(entry_files(root)) == 1
    assert main(["lakehouse", "clear", "--root", str(root)]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert entry_files(root) == []


def test_prune_target_from_env_uses_the_config_rules(
    filled: tuple[Path, list[str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, _ = filled
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_MAX_BYTES", "40K")  # K: powers of 1024
    assert main(["lakehouse", "prune", "--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["remaining_bytes"] == 30_000
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_MAX_BYTES", "")
    assert main(["lakehouse", "prune", "--root", str(root)]) == 2
    assert "pass --max-bytes, set" in capsys.readouterr().err


def test_missing_root_and_bad_options_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["lakehouse", "info", "--root", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err
    assert len(err.strip().splitlines()) == 1
    tmp_path.joinpath("plain").mkdir()
    assert main(["lakehouse", "ls", "--root", str(tmp_path / "plain")]) == 2
    assert "not a lakehouse cache root" in capsys.readouterr().err
    assert not (tmp_path / "plain" / "entries").exists()
    with pytest.raises(SystemExit) as exc:
        main(["lakehouse", "prune", "--root", str(tmp_path / "plain"), "--max-bytes", "10Q"])
    assert exc.value.code == 2
    assert "--max-bytes='10Q' is not a byte size" in capsys.readouterr().err


def test_read_shows_what_each_read_did_and_warms_the_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = str(write_old_file(tmp_path / "remote" / "a.parquet", os.urandom(5_000)))
    fresh = tmp_path / "remote" / "fresh.parquet"
    fresh.write_bytes(b"written just now")
    root = tmp_path / "c"
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_POLICY", "read_through")
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_MAX_BYTES", "1G")
    argv = ["lakehouse", "read", "--root", str(root), "--json"]
    assert main([*argv, source]) == 0
    (first,) = json.loads(capsys.readouterr().out)
    assert (first["cache_status"], first["read_mode"], first["fill_mode"]) == (
        "miss",
        "remote",
        "background",
    )
    assert len(entry_files(root)) == 1  # the background fill finished before exit
    assert main([*argv, source, str(fresh)]) == 0
    hit, too_new = json.loads(capsys.readouterr().out)
    assert (hit["cache_status"], hit["read_mode"]) == ("hit", "local")
    assert (too_new["cache_status"], too_new["reason"]) == ("bypass", "local_file_too_new")
    assert main(["lakehouse", "read", "--root", str(root), "--plan", source]) == 0
    out = capsys.readouterr().out
    assert re.search(r"hit +local +none +4\.9 KiB", out)


def test_info_without_a_root_still_shows_the_configuration(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_POLICY", "read_through")
    assert main(["lakehouse", "info", "--json"]) == 2
    out = capsys.readouterr()
    assert json.loads(out.out)["environment_config"]["policy"] == "read_through"
    assert "no cache root: pass --root, set NEXUS_LAKEHOUSE_CACHE_ROOT" in out.err


def test_public_helpers_read_the_environment_like_from_env(tmp_path: Path) -> None:
    from nexus_cache.lakehouse import config_errors_from_env, resolve_root

    assert resolve_root(environ={"NEXUS_LAKEHOUSE_CACHE_ROOT": " "}) is None
    assert resolve_root(environ={"NEXUS_LAKEHOUSE_CACHE_ROOT": str(tmp_path / "a")}) == (
        tmp_path / "a"
    )
    assert resolve_root(tmp_path / "b", environ={"NEXUS_LAKEHOUSE_CACHE_ROOT": "/x"}) == (
        tmp_path / "b"
    )
    env = {
        "NEXUS_LAKEHOUSE_CACHE_READ": "maybe",
        "NEXUS_LAKEHOUSE_CACHE_BYPASS_BYTES": "-1",
        "NEXUS_LAKEHOUSE_CACHE_POLICY": "",  # blank: unset, not an error
    }
    errors = config_errors_from_env(env)
    assert len(errors) == 2
    assert "NEXUS_LAKEHOUSE_CACHE_BYPASS_BYTES" in str(errors[0])
    assert "NEXUS_LAKEHOUSE_CACHE_READ" in str(errors[1])
    assert config_errors_from_env({}) == []


def test_stats_shows_the_reads_of_other_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = str(write_old_file(tmp_path / "remote" / "a.parquet", os.urandom(3_000)))
    root = tmp_path / "c"
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_POLICY", "fill_before_read")
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_MAX_BYTES", "1G")
    # two `read` runs stand for two reading programs; stats sees both
    assert main(["lakehouse", "read", "--root", str(root), source]) == 0
    assert main(["lakehouse", "read", "--root", str(root), source]) == 0
    capsys.readouterr()
    assert main(["lakehouse", "stats", "--root", str(root), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["processes"], data["reads"]["hit"], data["reads"]["miss"]) == (2, 1, 1)
    assert [r["cache_status"] for r in data["recent_reads"]] == ["miss", "hit"]
    assert main(["lakehouse", "stats", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"read hit +1", out)
    assert "recent reads" in out
    assert main(["lakehouse", "stats", "--root", str(tmp_path / "none")]) == 2


def test_object_names_that_are_not_utf8_print_escaped_on_a_utf8_terminal(
    tmp_path: Path,
) -> None:
    # A local file named in Latin-1 (b"caf\xe9"), or with a raw C1 byte (0x9b is
    # CSI on 8-bit terminals): Python names it with surrogates, which a UTF-8
    # stdout (any UTF-8 locale: errors="strict") cannot encode. Each command
    # used to stop mid-table with a UnicodeEncodeError; the bytes print escaped.
    import subprocess
    import sys

    remote = tmp_path / "remote"
    remote.mkdir()
    source = os.fsdecode(os.path.join(os.fsencode(remote), b"caf\xe9-\x9b31m.parquet"))
    write_old_file(Path(source), os.urandom(2_000))
    root = tmp_path / "c"
    env = {
        **os.environ,
        "PYTHONIOENCODING": "utf-8:strict",
        "NEXUS_LAKEHOUSE_CACHE_POLICY": "fill_before_read",
        "NEXUS_LAKEHOUSE_CACHE_MAX_BYTES": "1G",
    }
    escaped = "caf\\xe9-\\x9b31m.parquet"
    command = [sys.executable, "-m", "nexus_cache.cli.main", "lakehouse"]
    for argv in (["read", source], ["ls"], ["stats"], ["read", source + "-missing"]):
        done = subprocess.run(
            [*command, *argv, "--root", str(root)],
            env=env,
            capture_output=True,
            timeout=120,
        )
        out, err = done.stdout.decode(), done.stderr.decode()
        assert "UnicodeEncodeError" not in err, (argv, err)
        assert done.returncode == (2 if argv[-1].endswith("-missing") else 0), (argv, err)
        assert escaped in out + err, (argv, out, err)
        assert b"\x9b" not in done.stdout + done.stderr
