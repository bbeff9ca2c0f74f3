"""The remotes, our cache and fsspec's whole-file caches, built on the same remote."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from _lakehouse.data import MIB
from _lakehouse.s3 import make_s3fs

__all__ = ["PEERS", "Remote", "build_remote", "make_ours", "make_peer", "ours_read", "peer_read"]

#: fsspec's whole-file caches, the figures' peers
PEERS = ("simplecache", "filecache")


@dataclasses.dataclass
class Remote:
    """Where the object lives: ``fs`` + ``path`` (local: LocalFileSystem + absolute path)."""

    name: str
    fs: Any
    path: str
    local_source: Path | None  # the remote object itself when it is a local file

    def read_direct(self) -> bytes:
        with self.fs.open(self.path, "rb") as f:
            return bytes(f.read())


def build_remote(name: str, endpoint: str | None, data: Path, s3_path: str | None) -> Remote:
    if name == "local":
        from fsspec.implementations.local import LocalFileSystem

        return Remote("local", LocalFileSystem(), str(data), data)
    if endpoint is None or s3_path is None:
        raise ValueError("the s3 remote needs the moto endpoint and the object's path")
    return Remote("s3", make_s3fs(endpoint), s3_path, None)


def make_ours(root: Path, policy: str, size: int) -> Any:
    from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig

    config = LakehouseCacheConfig(root=root, policy=policy, max_bytes=8 * size + 64 * MIB)
    return LakehouseCache(config)


def make_peer(kind: str, remote_fs: Any, storage: Path) -> Any:
    import fsspec

    return fsspec.filesystem(
        kind, fs=remote_fs, cache_storage=str(storage), skip_instance_cache=True
    )


def ours_read(cache: Any, remote: Remote, expect: str) -> bytes:
    with cache.open(remote.path, fs=remote.fs) as f:
        data = f.read()
        status = f.diagnostics.cache_status.value
    if status != expect:
        raise RuntimeError(f"expected a cache {expect}, the read was a {status}")
    return data


def peer_read(pfs: Any, remote: Remote) -> bytes:
    with pfs.open(remote.path, "rb") as f:
        return bytes(f.read())
