"""The lakehouse hands out host bytes and file handles only: no module of it
imports a device library or the device side (frames, device, backends)."""

from __future__ import annotations

import ast
from pathlib import Path

import nexus_cache.lakehouse

DEVICE_SIDE = ("cupy", "cupyx", "kvikio", "rmm", "nexus_cache.device", "nexus_cache.backends")


def test_the_lakehouse_imports_nothing_of_devices() -> None:
    offences = []
    for path in sorted(Path(nexus_cache.lakehouse.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                if name.startswith((*DEVICE_SIDE, "nexus_cache.frames")):
                    offences.append(f"{path}: {name}")
    assert offences == []
    assert not hasattr(nexus_cache.lakehouse, "read_to_device")
