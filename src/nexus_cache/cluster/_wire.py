"""The form a ``ServiceConfig`` takes on one worker.

The config travels to the workers as JSON text (``ServiceConfig.to_json``),
never as a pickle: what a worker builds its service from is plain data it
validates again (``ServiceConfig.from_json``), then makes its own here.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from nexus_cache.service.config import DeviceSettings, ServiceConfig

__all__ = ["worker_config", "worker_dir_name"]


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
