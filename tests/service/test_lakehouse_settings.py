"""Lakehouse settings as users write them: the service TOML, bad roots, memory://."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nexus_cache.cli.main import main
from nexus_cache.errors import ConfigError
from nexus_cache.lakehouse import LakehouseCacheConfig
from nexus_cache.service import ServiceConfig, load_lakehouse_config, load_lakehouse_root


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in list(os.environ):
        if name.startswith("NEXUS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NEXUS_DEVICE_BACKEND", "host")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _toml(path: Path, body: str) -> Path:
    path.write_text(body, "utf-8")
    return path


def _make_root(path: Path) -> Path:
    from nexus_cache.lakehouse import LakehouseCache

    LakehouseCache(LakehouseCacheConfig(root=path)).close()
    return path


@pytest.mark.usefixtures("clean_env")
def test_lakehouse_commands_read_the_root_of_the_service_toml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from_file = _make_root(tmp_path / "from-file")
    from_env = _make_root(tmp_path / "from-env")
    from_flag = _make_root(tmp_path / "from-flag")
    toml = _toml(
        tmp_path / "service.toml",
        f'[lakehouse]\nroot = "{from_file}"\npolicy = "read_through"\nmax_bytes = "1GiB"\n',
    )

    def info(*extra: str) -> dict:
        assert main(["lakehouse", "info", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    assert info("--config", str(toml))["root"] == str(from_file)
    monkeypatch.setenv("NEXUS_SERVICE_CONFIG", str(toml))
    data = info()
    assert data["root"] == str(from_file)  # as the service reads it
    assert data["environment_config"]["policy"] == "read_through"
    assert ServiceConfig.from_env().lakehouse.root == from_file
    # precedence: --root, then the variable, then the file
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_ROOT", str(from_env))
    assert info()["root"] == str(from_env)
    assert info("--root", str(from_flag))["root"] == str(from_flag)
    # prune takes its target from the file too
    monkeypatch.delenv("NEXUS_LAKEHOUSE_CACHE_ROOT")
    assert main(["lakehouse", "prune", "--json"]) == 0
    capsys.readouterr()


@pytest.mark.usefixtures("clean_env")
def test_a_root_that_is_not_a_string_is_a_config_error_naming_key_and_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = _toml(tmp_path / "service.toml", "[lakehouse]\nroot = 5\n")
    with pytest.raises(ConfigError, match=r"service\.toml \[lakehouse\] root=5: .*directory path"):
        ServiceConfig.load(toml)
    with pytest.raises(ConfigError, match="root=5"):
        load_lakehouse_root(toml)
    with pytest.raises(ConfigError, match="not int"):
        LakehouseCacheConfig(root=5)  # type: ignore[arg-type]
    monkeypatch.setenv("NEXUS_SERVICE_CONFIG", str(toml))
    assert main(["lakehouse", "ls"]) == 2
    err = capsys.readouterr().err
    assert "root=5" in err
    assert "service.toml" in err
    assert "Traceback" not in err


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("root", ["~nexus-no-such-user-x/cache", "~nexus-no-such-user-x"])
def test_a_home_of_no_user_is_refused_and_nothing_is_created(tmp_path: Path, root: str) -> None:
    with pytest.raises(ConfigError, match=r"NEXUS_LAKEHOUSE_CACHE_ROOT=.*names no home"):
        LakehouseCacheConfig(root=root)
    with pytest.raises(ConfigError, match="names no home"):
        LakehouseCacheConfig.from_env({"NEXUS_LAKEHOUSE_CACHE_ROOT": root})
    assert not any(p.name.startswith("~") for p in tmp_path.iterdir())  # cwd is tmp_path


@pytest.mark.usefixtures("clean_env")
def test_memory_urls_say_what_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a memory:// root: refused, saying the root is a local directory
    with pytest.raises(ConfigError, match=r"memory:// is not local.*directory path"):
        LakehouseCacheConfig(root="memory://cache")
    assert LakehouseCacheConfig(root=f"file://{tmp_path}/c").root == tmp_path / "c"
    assert not (tmp_path / "memory:").exists()
    # a memory:// source in a new process: empty, and the message says why
    assert main(["scan", "memory://lake/t.parquet"]) == 2
    err = capsys.readouterr().err
    assert "memory://lake/t.parquet" in err
    assert "only what this process wrote" in err
    assert "s3://" in err


def test_memory_sources_work_within_one_process(tmp_path: Path) -> None:
    import io

    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    from nexus_cache.backends import HostBackend
    from nexus_cache.service import QueryService, Scan

    sink = io.BytesIO()
    pq.write_table(pa.table({"x": [1, 2, 3]}), sink)
    fsspec.filesystem("memory").pipe("/h19-lake/t.parquet", sink.getvalue())
    config = ServiceConfig(backend="host")
    with QueryService(config, backend=HostBackend(device_total_bytes=1 << 30)) as service:
        result = service.execute(Scan("memory://h19-lake/t.parquet"))
    assert result.table["x"].to_pylist() == [1, 2, 3]
    reason = result.diagnostics.source_cache["reason"]
    assert "no_content_identity" in reason
    assert "ETag" in reason


def test_load_lakehouse_config_reads_every_lakehouse_variable(tmp_path: Path) -> None:
    env = {
        "NEXUS_LAKEHOUSE_LOG_READS": "1",
        "NEXUS_LAKEHOUSE_CACHE_IDENTITY_TTL": "5",
        "NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S": "7",
    }
    config = load_lakehouse_config(environ=env)
    assert (config.log_reads, config.identity_ttl_s, config.fill_exit_wait_s) == (True, 5.0, 7.0)
    assert ServiceConfig.load(environ=env).lakehouse == config
