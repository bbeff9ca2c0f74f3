from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from nexus_cache._sizes import parse_size
from nexus_cache.errors import ConfigError
from nexus_cache.lakehouse._config import (
    FillPolicy,
    LakehouseCacheConfig,
    ReadPolicy,
)

ROOT = "NEXUS_LAKEHOUSE_CACHE_ROOT"
READ = "NEXUS_LAKEHOUSE_CACHE_READ"
POLICY = "NEXUS_LAKEHOUSE_CACHE_POLICY"
MAX = "NEXUS_LAKEHOUSE_CACHE_MAX_BYTES"
CONC = "NEXUS_LAKEHOUSE_FILL_MAX_CONCURRENCY"
HOST = "NEXUS_LAKEHOUSE_FILL_MAX_HOST_BYTES"
BYPASS = "NEXUS_LAKEHOUSE_CACHE_BYPASS_BYTES"


def test_defaults_from_empty_env() -> None:
    config = LakehouseCacheConfig.from_env({})
    assert config.root is None
    assert not config.enabled
    assert config.read is ReadPolicy.ENABLED
    assert config.policy is FillPolicy.DISABLED
    assert config.max_bytes is None
    assert config.fill_max_concurrency == 4
    assert config.fill_max_host_bytes == 2 * 1024**3
    assert config.bypass_bytes is None


def test_every_variable_is_read(tmp_path: Path) -> None:
    env = {
        ROOT: str(tmp_path),
        READ: "Disabled",
        POLICY: " read_through ",
        MAX: "10GiB",
        CONC: "7",
        HOST: "512MB",
        BYPASS: "1TiB",
    }
    config = LakehouseCacheConfig.from_env(env)
    assert config.root == tmp_path
    assert config.read is ReadPolicy.DISABLED
    assert config.policy is FillPolicy.READ_THROUGH
    assert config.max_bytes == 10 * 1024**3
    assert config.fill_max_concurrency == 7
    assert config.fill_max_host_bytes == 512 * 1000**2
    assert config.bypass_bytes == 1024**4


def test_empty_values_count_as_unset() -> None:
    config = LakehouseCacheConfig.from_env({ROOT: "", POLICY: " ", MAX: ""})
    assert config.root is None
    assert config.policy is FillPolicy.DISABLED


def test_overrides_win(tmp_path: Path) -> None:
    config = LakehouseCacheConfig.from_env({ROOT: "/nonexistent"}, root=tmp_path)
    assert config.root == tmp_path


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [
        (READ, "maybe", "enabled, disabled"),
        (POLICY, "always", "disabled, read_through, fill_before_read"),
        (MAX, "10Q", "KiB"),
        (MAX, "-5", "KiB"),
        (MAX, "0", "positive"),
        (CONC, "0", ">= 1"),
        (CONC, "four", ">= 1"),
        (HOST, "lots", "GiB"),
        (BYPASS, "1.5GiB", "GiB"),
        (MAX, "\u0661\u0662\u0663", "not a byte size"),  # Arabic-Indic digits, not 123
    ],
)
def test_bad_values_name_variable_value_and_accepted(
    tmp_path: Path, name: str, value: str, accepted: str
) -> None:
    env = {ROOT: str(tmp_path), MAX: "1GiB", name: value}
    with pytest.raises(ConfigError) as info:
        LakehouseCacheConfig.from_env(env)
    message = str(info.value)
    assert name in message
    assert repr(value) in message
    assert accepted in message


@pytest.mark.parametrize("policy", ["read_through", "fill_before_read"])
def test_filling_policy_requires_max_bytes(tmp_path: Path, policy: str) -> None:
    with pytest.raises(ConfigError, match=MAX):
        LakehouseCacheConfig.from_env({ROOT: str(tmp_path), POLICY: policy})


def test_read_only_root_needs_no_max_bytes(tmp_path: Path) -> None:
    config = LakehouseCacheConfig.from_env({ROOT: str(tmp_path)})
    assert config.enabled
    assert config.policy is FillPolicy.DISABLED


def test_filling_policy_without_root_is_no_cache() -> None:
    config = LakehouseCacheConfig.from_env({POLICY: "read_through"})
    assert not config.enabled


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", 1),
        ("1B", 1),
        ("2kb", 2000),
        ("3 KiB", 3072),
        ("1MB", 10**6),
        ("1mib", 2**20),
        ("4GB", 4 * 10**9),
        ("10GiB", 10 * 2**30),
        ("1TB", 10**12),
        ("1TiB", 2**40),
        (12345, 12345),
    ],
)
def test_byte_sizes(text: str | int, expected: int) -> None:
    assert parse_size(text, name="X") == expected


def test_constructor_accepts_strings_and_relative_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = LakehouseCacheConfig(root="c", policy="fill_before_read", max_bytes="1MiB")
    assert config.root == tmp_path / "c"
    assert config.policy is FillPolicy.FILL_BEFORE_READ
    assert config.max_bytes == 2**20
    assert config.to_dict()["policy"] == "fill_before_read"


# --- values refused where they enter ------------------------------------------------


@pytest.mark.parametrize(
    "field", ["blocking_fill_timeout_s", "local_min_age_s", "stale_temp_age_s", "fill_exit_wait_s"]
)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, "nan", True, "soon"])
def test_seconds_settings_refuse_nan_inf_negative(
    tmp_path: Path, field: str, value: object
) -> None:
    with pytest.raises(ConfigError) as info:
        LakehouseCacheConfig(root=tmp_path, **{field: value})
    named = "NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S" if field == "fill_exit_wait_s" else field
    assert named in str(info.value)
    assert "finite" in str(info.value)


def test_seconds_longer_than_any_thread_wait_are_refused(tmp_path: Path) -> None:
    # 1e18 s passed finiteness; the exit hook's wait then raised OverflowError
    # (the fills were abandoned and the read summary never written), and so did
    # every blocking fill's lock wait.
    with pytest.raises(ConfigError) as info:
        LakehouseCacheConfig.from_env(
            {ROOT: str(tmp_path), "NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S": "1e18"}
        )
    assert "NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S='1e18'" in str(info.value)
    with pytest.raises(ConfigError, match="blocking_fill_timeout_s"):
        LakehouseCacheConfig(root=tmp_path, blocking_fill_timeout_s=threading.TIMEOUT_MAX * 2)
    longest = LakehouseCacheConfig(root=tmp_path, fill_exit_wait_s=threading.TIMEOUT_MAX)
    assert longest.fill_exit_wait_s == threading.TIMEOUT_MAX


def test_seconds_settings_accept_numbers_and_text(tmp_path: Path) -> None:
    config = LakehouseCacheConfig.from_env(
        {ROOT: str(tmp_path), "NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S": " 2.5 "}, local_min_age_s=0
    )
    assert (config.fill_exit_wait_s, config.local_min_age_s) == (2.5, 0.0)


def test_every_bad_value_is_named_in_one_error(tmp_path: Path) -> None:
    env = {ROOT: str(tmp_path), MAX: "lots", CONC: "0", POLICY: "always"}
    with pytest.raises(ConfigError) as info:
        LakehouseCacheConfig.from_env(env)
    for name in (MAX, CONC, POLICY):
        assert name in str(info.value)


@pytest.mark.parametrize("root", ["", "  "])
def test_empty_root_is_refused(root: str) -> None:
    with pytest.raises(ConfigError, match=ROOT):
        LakehouseCacheConfig(root=root)


def test_root_with_a_nul_character_is_a_config_error_naming_the_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A TOML string may hold "\u0000": the cache failed to open with a bare
    # "ValueError: embedded null byte" (and `lakehouse ls --config` with it).
    from nexus_cache.cli.main import main
    from nexus_cache.lakehouse import LakehouseCache

    with pytest.raises(ConfigError, match=rf"{ROOT}=.*NUL character"):
        LakehouseCache(LakehouseCacheConfig(root=f"{tmp_path}/a\0b"))
    config = tmp_path / "service.toml"
    config.write_text(f'[lakehouse]\nroot = "{tmp_path}/a\\u0000b"\n')
    monkeypatch.delenv(ROOT, raising=False)
    assert main(["lakehouse", "ls", "--config", str(config)]) == 2
    assert re.search(r"service\.toml \[lakehouse\] root=.*NUL character", capsys.readouterr().err)


def test_root_that_is_a_file_is_a_config_error_naming_the_variable(tmp_path: Path) -> None:
    from nexus_cache.lakehouse import LakehouseCache

    afile = tmp_path / "afile"
    afile.write_bytes(b"x")
    with pytest.raises(ConfigError, match=ROOT):
        LakehouseCache.from_env({ROOT: str(afile)})
    # a file as a parent component fails when the root is created: same error
    with pytest.raises(ConfigError, match=ROOT):
        LakehouseCache.from_env({ROOT: str(afile / "sub")})


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("ON", True), ("0", False)])
def test_log_reads_flag(value: str, expected: bool) -> None:
    assert (
        LakehouseCacheConfig.from_env({"NEXUS_LAKEHOUSE_LOG_READS": value}).log_reads is expected
    )
    with pytest.raises(ConfigError, match="NEXUS_LAKEHOUSE_LOG_READS"):
        LakehouseCacheConfig.from_env({"NEXUS_LAKEHOUSE_LOG_READS": "sometimes"})
