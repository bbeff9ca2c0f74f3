"""The rules every ``nexus-cache`` command shares: version, errors, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import nexus_cache
from nexus_cache.cli._output import EXIT_PROBLEMS, EXIT_USAGE
from nexus_cache.cli.main import main


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NEXUS_LAKEHOUSE_CACHE_ROOT", "NEXUS_PROGRAM_CACHE_DIR", "NEXUS_DEVICE_BACKEND"):
        monkeypatch.delenv(name, raising=False)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"nexus-cache {nexus_cache.__version__}"


def test_installed_entry_point_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nexus_cache.cli.main", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.startswith("nexus-cache ")


@pytest.mark.parametrize(
    "argv",
    [
        ["program-cache", "info", "--path", "{missing}"],
        ["program-cache", "ls", "--backend", "sqlite", "--path", "{missing}"],
        ["lakehouse", "info", "--root", "{missing}"],
        ["lakehouse", "verify", "--root", "{missing}"],
        ["lakehouse", "ls"],  # no root at all
    ],
)
def test_missing_cache_exits_2_in_every_group(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nothing-here")
    assert main([a.format(missing=missing) for a in argv]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("nexus-cache: error: ")
    assert len(err.splitlines()) == 1
    assert not Path(missing).exists()


@pytest.mark.parametrize(
    ("variable", "value", "argv"),
    [
        ("NEXUS_DEVICE_BACKEND", "gpu", ["device", "report"]),
        ("NEXUS_LAKEHOUSE_CACHE_POLICY", "sometimes", ["lakehouse", "info", "--root", "{root}"]),
        ("NEXUS_LAKEHOUSE_CACHE_MAX_BYTES", "ten", ["lakehouse", "prune", "--root", "{root}"]),
    ],
)
def test_bad_configuration_exits_2_in_every_group(
    variable: str,
    value: str,
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig

    LakehouseCache(LakehouseCacheConfig(root=tmp_path / "c")).close()
    monkeypatch.setenv(variable, value)
    assert main([a.format(root=tmp_path / "c") for a in argv]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{variable}={value!r}" in err


def test_unexpected_error_is_one_line_and_debug_shows_the_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import nexus_cache.program as program

    def broken(path: str | None, arch: str) -> int:
        raise RuntimeError("NVRTC said no\nsecond line")

    monkeypatch.setattr(program, "run_demo", broken)
    assert main(["program-cache", "demo"]) == EXIT_PROBLEMS
    err = capsys.readouterr().err
    assert err == "nexus-cache: error: RuntimeError: NVRTC said no second line\n"
    assert main(["--debug", "program-cache", "demo"]) == EXIT_PROBLEMS
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert err.rstrip().endswith("nexus-cache: error: RuntimeError: NVRTC said no second line")


def test_missing_extra_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    assert main(["device", "report", "--backend", "host", "--format", "prometheus"]) == 2
    assert "nexus-cache[metrics]" in capsys.readouterr().err


def test_every_reporting_command_has_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig
    from nexus_cache.program import FileStreamProgramCache

    FileStreamProgramCache(tmp_path / "p").update({b"k": b"v"})
    LakehouseCache(LakehouseCacheConfig(root=tmp_path / "l")).close()
    commands = [
        ["program-cache", action, "--path", str(tmp_path / "p")]
        for action in ("info", "ls", "verify")
    ]
    commands += [
        ["lakehouse", a, "--root", str(tmp_path / "l")] for a in ("info", "ls", "stats", "verify")
    ]
    commands.append(["device", "report", "--backend", "host"])
    for argv in commands:
        assert main([*argv, "--json"]) == 0, argv
        json.loads(capsys.readouterr().out)


def test_building_the_command_line_imports_no_library_layer() -> None:
    code = (
        "import sys; from nexus_cache.cli.main import build_parser; build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('fsspec', 'pyarrow', 'numpy', 'cupy', 'cuda') or m.startswith('nexus_cache.lakehouse') "
        "or m.startswith('nexus_cache.program') or m.startswith('nexus_cache.device')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_spelled_out_service_constants_agree_with_the_service() -> None:
    from nexus_cache.cli import demo
    from nexus_cache.service.demo import DEFAULT_SCALE

    assert demo.DEFAULT_SCALE == DEFAULT_SCALE
