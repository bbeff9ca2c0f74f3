"""ServiceConfig: defaults, TOML, environment, precedence, and refusals that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from nexus_cache.errors import ConfigError
from nexus_cache.service import DeviceSettings, ServiceConfig


def test_defaults() -> None:
    config = ServiceConfig.load(environ={})
    assert config.backend == "auto"
    assert config.devices is None
    assert config.evidence_dir is None
    assert config.max_attempts == 3
    assert config.admission_timeout_s == 30.0
    assert config.lakehouse.root is None


def test_toml_file_then_environment_then_overrides(tmp_path: Path) -> None:
    toml = tmp_path / "service.toml"
    toml.write_text(
        f"""
backend = "host"
evidence_dir = "{tmp_path / "ev"}"
max_attempts = 5
admission_timeout_s = 2.5

[lakehouse]
root = "{tmp_path / "cache"}"
policy = "read_through"
max_bytes = "10GiB"

[[devices]]
id = 0
cache_cap_bytes = "512MiB"
"""
    )
    config = ServiceConfig.load(toml, environ={})
    assert config.backend == "host"
    assert config.max_attempts == 5
    assert config.admission_timeout_s == 2.5
    assert config.evidence_dir == tmp_path / "ev"
    assert config.devices == (DeviceSettings(0, 512 << 20),)
    assert config.lakehouse.policy.value == "read_through"
    assert config.lakehouse.max_bytes == 10 << 30
    # the environment wins over the file, overrides over both
    env = {
        "NEXUS_SERVICE_MAX_ATTEMPTS": "2",
        "NEXUS_LAKEHOUSE_CACHE_POLICY": "fill_before_read",
        "NEXUS_SERVICE_CONFIG": "/nonexistent/ignored-because-path-given",
    }
    config = ServiceConfig.load(toml, environ=env, admission_timeout_s=1)
    assert config.max_attempts == 2
    assert config.lakehouse.policy.value == "fill_before_read"
    assert config.admission_timeout_s == 1


def test_storage_options_table(tmp_path: Path) -> None:
    toml = tmp_path / "s.toml"
    toml.write_text(
        "[storage_options]\nanon = false\n[storage_options.client_kwargs]\n"
        'endpoint_url = "http://127.0.0.1:9000"\n'
    )
    config = ServiceConfig.load(toml, environ={})
    assert config.storage_options == {
        "anon": False,
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"},
    }
    assert config.to_dict()["storage_options"] == ["anon", "client_kwargs"]  # keys only
    toml.write_text('storage_options = "anon"\n')
    with pytest.raises(ConfigError, match=r"\[storage_options\] table"):
        ServiceConfig.load(toml, environ={})


def test_environment_names_the_file(tmp_path: Path) -> None:
    toml = tmp_path / "s.toml"
    toml.write_text('backend = "host"\ncache_cap_bytes = "1G"\n')
    config = ServiceConfig.from_env({"NEXUS_SERVICE_CONFIG": str(toml)})
    assert config.backend == "host"
    assert config.cache_cap_bytes == 1 << 30


def test_environment_devices_and_cap() -> None:
    config = ServiceConfig.from_env(
        {"NEXUS_SERVICE_DEVICES": "0, 1", "NEXUS_DEVICE_CACHE_CAP_BYTES": "0"}
    )
    assert [d.device_id for d in config.devices or ()] == [0, 1]
    assert config.cache_cap_bytes == 0


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"NEXUS_DEVICE_BACKEND": "tpu"}, ["NEXUS_DEVICE_BACKEND", "'tpu'", "auto, cuda, host"]),
        ({"NEXUS_SERVICE_MAX_ATTEMPTS": "0"}, ["NEXUS_SERVICE_MAX_ATTEMPTS", "'0'", ">= 1"]),
        ({"NEXUS_SERVICE_MAX_ATTEMPTS": "2.5"}, ["NEXUS_SERVICE_MAX_ATTEMPTS", "whole number"]),
        (
            {"NEXUS_SERVICE_ADMISSION_TIMEOUT_S": "nan"},
            ["NEXUS_SERVICE_ADMISSION_TIMEOUT_S", "'nan'", ">= 0"],
        ),
        ({"NEXUS_SERVICE_ADMISSION_TIMEOUT_S": "inf"}, ["'inf'"]),
        ({"NEXUS_SERVICE_ADMISSION_TIMEOUT_S": "-1"}, ["'-1'", ">= 0"]),
        ({"NEXUS_SERVICE_GRANT_EXPANSION": "0"}, ["NEXUS_SERVICE_GRANT_EXPANSION", "> 0"]),
        # finite, but the grant arithmetic overflowed at the first query
        (
            {"NEXUS_SERVICE_GRANT_EXPANSION": "1e308"},
            ["NEXUS_SERVICE_GRANT_EXPANSION", "'1e308'", "<= 1024"],
        ),
        ({"NEXUS_SERVICE_GRANT_EXPANSION": "1025"}, ["NEXUS_SERVICE_GRANT_EXPANSION", "<= 1024"]),
        ({"NEXUS_DEVICE_CACHE_CAP_BYTES": "lots"}, ["NEXUS_DEVICE_CACHE_CAP_BYTES", "'lots'"]),
        ({"NEXUS_SERVICE_DEVICES": "0,x"}, ["NEXUS_SERVICE_DEVICES", "'0,x'", "0,1"]),
        ({"NEXUS_LAKEHOUSE_CACHE_POLICY": "sometimes"}, ["sometimes", "read_through"]),
    ],
)
def test_bad_environment_values_name_key_value_and_accepted(
    env: dict[str, str], words: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        ServiceConfig.from_env(env)
    for word in words:
        assert word in str(info.value)


def test_the_largest_grant_expansion_is_accepted() -> None:
    config = ServiceConfig.from_env({"NEXUS_SERVICE_GRANT_EXPANSION": "1024"})
    assert config.grant_expansion == 1024.0


def test_bad_toml(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('backend = "host"\ncolour = "blue"\n')
    with pytest.raises(ConfigError, match=r"unknown key 'colour'.*accepted keys: backend"):
        ServiceConfig.load(path, environ={})
    path.write_text("[lakehouse]\nroot_dir = '/x'\n")
    with pytest.raises(ConfigError, match=r"\[lakehouse\]: unknown key 'root_dir'"):
        ServiceConfig.load(path, environ={})
    path.write_text("[[devices]]\ncache_cap_bytes = 1\n")
    with pytest.raises(ConfigError, match="has no id"):
        ServiceConfig.load(path, environ={})
    path.write_text("[[devices]]\nid = 0\n[[devices]]\nid = 0\n")
    with pytest.raises(ConfigError, match="lists a device twice"):
        ServiceConfig.load(path, environ={})
    path.write_text("backend = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        ServiceConfig.load(path, environ={})
    with pytest.raises(ConfigError, match="no such file"):
        ServiceConfig.load(tmp_path / "missing.toml", environ={})


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ('max_bytes = "nan"', "max_bytes"),
        ("fill_max_concurrency = 0", "fill_max_concurrency"),
        ('policy = "sometimes"', "policy"),
        ("bypass_bytes = -1", "bypass_bytes"),
    ],
)
def test_bad_lakehouse_toml_values_are_named_by_their_place_in_the_file(
    tmp_path: Path, line: str, key: str
) -> None:
    # They were reported under the NEXUS_LAKEHOUSE_* variable, which was not set.
    path = tmp_path / "service.toml"
    path.write_text(f"[lakehouse]\n{line}\n")
    with pytest.raises(ConfigError) as exc:
        ServiceConfig.load(path, environ={})
    assert str(exc.value).startswith(f"{path} [lakehouse] {key}=")


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('cache_cap_bytes = "abc"', "cache_cap_bytes='abc' is not a byte size"),
        ("max_attempts = 0", "max_attempts=0 is not accepted"),
        ('backend = "tpu"', "backend='tpu'"),
        ("admission_timeout_s = -1", "admission_timeout_s=-1"),
    ],
)
def test_bad_service_toml_values_name_the_file(tmp_path: Path, line: str, said: str) -> None:
    # they named the setting alone, so a user did not know the file was at fault
    path = tmp_path / "service.toml"
    path.write_text(f"{line}\n")
    with pytest.raises(ConfigError) as exc:
        ServiceConfig.load(path, environ={})
    assert str(exc.value).startswith(f"{path}: {said}")


def test_lakehouse_rule_applies() -> None:
    with pytest.raises(ConfigError, match="NEXUS_LAKEHOUSE_CACHE_MAX_BYTES is required"):
        ServiceConfig.from_env(
            {
                "NEXUS_LAKEHOUSE_CACHE_ROOT": "/tmp/x",
                "NEXUS_LAKEHOUSE_CACHE_POLICY": "read_through",
            }
        )


def test_python_callers_mistakes_are_config_errors(tmp_path: Path) -> None:
    from nexus_cache.service import QueryService

    assert ServiceConfig(devices=[0, 1]).devices == (DeviceSettings(0), DeviceSettings(1))
    for devices in (0, "0", {"id": 0}):
        with pytest.raises(ConfigError, match="devices="):
            ServiceConfig(devices=devices)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no setting bogus"):
        ServiceConfig.load(environ={}, bogus=1)
    with pytest.raises(ConfigError, match=r"^path='.*missing\.toml': no such file"):
        ServiceConfig.load(tmp_path / "missing.toml", environ={})
    with pytest.raises(ConfigError, match="use a ServiceConfig"):
        QueryService("service.toml")  # type: ignore[arg-type]
