"""The service config as JSON for the workers, and each worker's own form of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from nexus_cache.cluster._wire import worker_config, worker_dir_name
from nexus_cache.errors import ConfigError
from nexus_cache.lakehouse import LakehouseCacheConfig
from nexus_cache.service import DeviceSettings, ServiceConfig


def _config(tmp_path: Path, **overrides) -> ServiceConfig:  # type: ignore[no-untyped-def]
    settings = {
        "backend": "host",
        "cache_cap_bytes": "64MiB",
        "evidence_dir": tmp_path / "evidence",
        "max_attempts": 5,
        "grant_expansion": 2.5,
        "storage_options": {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}},
        "allowed_roots": [str(tmp_path / "data"), "s3://bucket/lake"],
        "lakehouse": LakehouseCacheConfig(
            root=tmp_path / "lake",
            policy="fill_before_read",
            max_bytes="1GiB",
            identity_ttl_s=30.0,
        ),
        **overrides,
    }
    return ServiceConfig(**settings)


def test_every_setting_survives_the_trip(tmp_path):
    config = _config(tmp_path, devices=[DeviceSettings(0, 1 << 20, 1 << 30)])
    text = config.to_json()
    assert isinstance(text, str)
    assert ServiceConfig.from_json(text) == config


def test_storage_options_that_are_not_plain_data_are_refused(tmp_path):
    config = _config(tmp_path, storage_options={"session": object()})
    with pytest.raises(ConfigError, match="storage_options plain"):
        config.to_json()


def test_a_value_changed_on_the_way_is_validated_again(tmp_path):
    text = _config(tmp_path).to_json().replace('"max_attempts": 5', '"max_attempts": 0')
    with pytest.raises(ConfigError, match="max_attempts"):
        ServiceConfig.from_json(text)


def test_each_worker_gets_its_own_roots_and_one_device(tmp_path):
    config = _config(tmp_path)
    mine = worker_config(config, "tcp://10.0.0.1:4000")
    assert mine.lakehouse.root == tmp_path / "lake" / "worker-tcp___10.0.0.1_4000"
    assert mine.evidence_dir == tmp_path / "evidence" / "worker-tcp___10.0.0.1_4000"
    assert mine.devices == (DeviceSettings(0),)
    assert mine.lakehouse.policy == config.lakehouse.policy
    assert worker_config(config, 0).lakehouse.root == tmp_path / "lake" / "worker-0"
    listed = _config(tmp_path, devices=[1])
    assert worker_config(listed, 0).devices == (DeviceSettings(1),)
    off = _config(tmp_path, evidence_dir=None, lakehouse=LakehouseCacheConfig())
    assert worker_config(off, 0).lakehouse.root is None
    assert worker_config(off, 0).evidence_dir is None
    assert worker_dir_name("") == "worker-_"
