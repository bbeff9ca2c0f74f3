"""A ``ServiceConfig`` as plain JSON, and the form it takes on one worker.

The config travels to the workers as JSON text, never as a pickle: what a
worker builds its service from is plain data it validates again.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from nexus_cache.errors import ConfigError
from nexus_cache.lakehouse import LakehouseCacheConfig
from nexus_cache.service.config import DeviceSettings, ServiceConfig

__all__ = ["config_from_json", "config_to_json", "worker_config", "worker_dir_name"]


def config_to_json(config: ServiceConfig) -> str:
    """Every setting of ``config`` as JSON text (storage options in full)."""
    data = config.to_dict()
    # to_dict names the storage options' keys only; the workers need the values.
    data["storage_options"] = (
        None if config.storage_options is None else dict(config.storage_options)
    )
    try:
        return json.dumps(data, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"the service config cannot be sent to the workers as JSON ({exc}); give "
            "storage_options plain strings, numbers, lists and tables"
        ) from None


def config_from_json(text: str) -> ServiceConfig:
    """The :class:`ServiceConfig` :func:`config_to_json` wrote, validated again."""
    data: dict[str, Any] = json.loads(text)
    devices = data.pop("devices")
    lakehouse = LakehouseCacheConfig(**data.pop("lakehouse"))
    return ServiceConfig(
        **data,
        devices=None if devices is None else tuple(DeviceSettings(**d) for d in devices),
        lakehouse=lakehouse,
    )


def worker_dir_name(name: object) -> str:
    """A directory name for the worker Dask calls ``name`` (stable across its restarts)."""
    return "worker-" + (re.sub(r"[^A-Za-z0-9._-]", "_", str(name)) or "_")


def worker_config(config: ServiceConfig, name: object) -> ServiceConfig:
    """``config`` as the worker ``name`` uses it: its own lakehouse root and evidence
    directory (``<setting>/worker-<name>``) and, when ``devices`` is unset, one
    device: the first the worker sees (with dask-cuda, its own GPU)."""
    sub = worker_dir_name(name)
    changes: dict[str, Any] = {}
    if config.lakehouse.root is not None:
        changes["lakehouse"] = dataclasses.replace(
            config.lakehouse, root=Path(config.lakehouse.root) / sub
        )
    if config.evidence_dir is not None:
        changes["evidence_dir"] = Path(config.evidence_dir) / sub
    if config.devices is None:
        changes["devices"] = (DeviceSettings(0),)
    return dataclasses.replace(config, **changes)
