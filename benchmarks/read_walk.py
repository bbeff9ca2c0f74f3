"""How many times one ``nexus::`` read moves between the lakehouse modules.

Counts, with ``sys.setprofile`` on the reading thread, the Python call and
return events of one read (open, read all, close) that land in
``nexus_cache.lakehouse``: each time the innermost lakehouse frame changes
module is a **stay** in that module; a stay in a module already visited
during the read is a **return** (returns = stays - modules visited). Fewer
returns: the read can be followed top to bottom with fewer jumps back.

Four reads through ``NexusCacheFileSystem`` (``read_through`` policy, a fresh
cache root in a temporary directory):

* ``local cold``: a local file never read (a miss, read from the file);
* ``local hit``: the same file once its entry is filled;
* ``remote cold``: an object of an fsspec in-memory store that reports an
  ETag (a remote store with a content identity), never read;
* ``remote hit``: the same object again once filled (planned from the
  identity proven at the first read, the probe overlapped).

    python benchmarks/read_walk.py            # a table
    python benchmarks/read_walk.py --json     # one JSON object
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["Walk", "main", "measure_walks", "walk"]

_PACKAGE = "nexus_cache.lakehouse"


class Walk:
    """The stays of one traced call: the lakehouse modules in the order visited."""

    def __init__(self, stays: list[str]) -> None:
        self.stays = stays

    @property
    def modules(self) -> list[str]:
        return sorted(set(self.stays))

    @property
    def returns(self) -> int:
        return len(self.stays) - len(self.modules)

    def visits(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for module in self.stays:
            out[module] = out.get(module, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def to_dict(self) -> dict[str, Any]:
        return {
            "stays": len(self.stays),
            "modules": len(self.modules),
            "returns": self.returns,
            "visits": self.visits(),
        }


def _lakehouse_module(frame: FrameType | None) -> str | None:
    """The module of the innermost lakehouse frame at or above ``frame``."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name == _PACKAGE or name.startswith(_PACKAGE + "."):
            return str(name)[len(_PACKAGE) + 1 :] or "__init__"
        frame = frame.f_back
    return None


def walk(body: Callable[[], Any]) -> Walk:
    """Run ``body`` on this thread and return the lakehouse modules it stayed in."""
    stays: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            here = _lakehouse_module(frame)
        elif event == "return":
            here = _lakehouse_module(frame.f_back)
        else:
            return
        if here is not None and (not stays or stays[-1] != here):
            stays.append(here)

    sys.setprofile(profile)
    try:
        body()
    finally:
        sys.setprofile(None)
    return Walk(stays)


def _etag_memory_fs() -> Any:
    """An fsspec in-memory filesystem whose ``info`` carries an ETag, like S3's."""
    import hashlib

    from fsspec.implementations.memory import MemoryFileSystem

    class _ETagMemory(MemoryFileSystem):  # type: ignore[misc]
        protocol = ("etagmemory",)
        root_marker = "/"

        def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
            out = dict(super().info(path, **kwargs))
            if out.get("type") == "file":
                data = self.cat_file(path)
                out["ETag"] = hashlib.md5(data, usedforsecurity=False).hexdigest()
            return out

    fs = _ETagMemory(skip_instance_cache=True)
    fs.store = {}  # not the class-wide store other memory filesystems share
    fs.pseudo_dirs = [""]
    return fs


def measure_walks(workdir: Path) -> dict[str, Walk]:
    """The four reads of the module notes, each traced; ``workdir`` must be empty."""
    from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig, NexusCacheFileSystem

    data = os.urandom(256 * 1024)
    local = workdir / "data.bin"
    local.write_bytes(data)
    past = time.time() - 60  # old enough for a local identity
    os.utime(local, (past, past))
    remote_fs = _etag_memory_fs()
    remote_fs.pipe_file("/bucket/data.bin", data)

    config = LakehouseCacheConfig(root=workdir / "cache", policy="read_through", max_bytes=1 << 30)
    out: dict[str, Walk] = {}
    with LakehouseCache(config) as cache:
        local_fs = NexusCacheFileSystem(cache=cache)
        nexus_remote = NexusCacheFileSystem(fs=remote_fs, cache=cache)
        for name, fs, path in (
            ("local", local_fs, f"file://{local}"),
            ("remote", nexus_remote, "/bucket/data.bin"),
        ):
            for state in ("cold", "hit"):

                def read(fs: Any = fs, path: str = path) -> None:
                    with fs.open(path, "rb") as f:
                        assert f.read() == data

                out[f"{name} {state}"] = walk(read)
                if state == "cold":
                    assert cache.wait_for_fills(30), "the background fill did not finish"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        walks = measure_walks(Path(tmp))
    if args.json:
        print(json.dumps({name: w.to_dict() for name, w in walks.items()}, indent=2))
        return 0
    for name, w in walks.items():
        d = w.to_dict()
        print(
            f"RESULT {name:<12} stays {d['stays']:>3}  modules {d['modules']:>2}  "
            f"returns {d['returns']:>3}  ({', '.join(f'{m} {n}' for m, n in d['visits'].items())})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
