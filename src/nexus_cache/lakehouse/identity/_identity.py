"""Identity of a lakehouse cache entry.

An entry is reused only when its identity is proven. The identity has three parts:

* **storage domain** -- protocol, endpoint and bucket/account (for local files:
  ``file``, the host name and the device number);
* **content identity** -- the object's size plus its ETag and/or version id; for
  local files size, ``mtime_ns`` and inode, trusted only once the file is older
  than a few seconds (a file still being written can change within one mtime tick);
* **normalized source location** -- ``protocol://path`` with the protocol stripped
  once and, for local files, symlinks resolved.

The entry key is the SHA-256 of a canonical JSON encoding of the three. When no
strong content identity exists, :func:`resolve_identity` returns a bypass reason
instead: such an object is read remotely and never cached.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import os
import socket
import stat
import time
from typing import Any

from nexus_cache._lru import BoundedLRU

__all__ = [
    "ContentIdentity",
    "Resolution",
    "SourceIdentity",
    "StorageDomain",
    "fs_protocol",
    "identity_from_info",
    "is_local_fs",
    "known_identity",
    "resolve_identity",
]


@dataclasses.dataclass(frozen=True)
class StorageDomain:
    """Where an object lives: protocol, endpoint and bucket/account.

    Parameters
    ----------
    protocol : str
        The fsspec protocol (``s3``, ``file``).
    endpoint : str
        The service endpoint (for local files: the host).
    container : str
        The bucket or account (for local files: the device).

    Examples
    --------
    >>> from nexus_cache.lakehouse import StorageDomain
    >>> StorageDomain("s3", "https://s3.amazonaws.com", "bucket").container
    'bucket'
    """

    protocol: str
    endpoint: str
    container: str


@dataclasses.dataclass(frozen=True)
class ContentIdentity:
    """What an object contains, as far as the store can prove it.

    Parameters
    ----------
    size : int
        The object's size in bytes.
    etag, version_id : str or None, optional
        The store's ETag and object version.
    mtime_ns, inode : int or None, optional
        A local file's modification time and inode.

    Examples
    --------
    >>> from nexus_cache.lakehouse import ContentIdentity
    >>> ContentIdentity(size=498, etag='"9b2cf535f27731c974343645a3985328"').kind
    'etag'
    >>> ContentIdentity(size=498, version_id="v2").kind
    'version'
    """

    size: int
    etag: str | None = None
    version_id: str | None = None
    mtime_ns: int | None = None
    inode: int | None = None

    @property
    def kind(self) -> str:
        if self.inode is not None:
            return "local"
        if self.version_id:
            return "version"
        # neither: an immutable object (a table's data file), known by its size
        return "etag" if self.etag else "immutable"


@dataclasses.dataclass(frozen=True)
class SourceIdentity:
    """The full identity of a remote object; ``key`` names its cache entry.

    Parameters
    ----------
    domain : StorageDomain
        Where the object lives.
    content : ContentIdentity
        What it contains.
    location : str
        Its URL.

    Examples
    --------
    >>> from nexus_cache.lakehouse import ContentIdentity, SourceIdentity, StorageDomain
    >>> domain = StorageDomain("s3", "https://s3.amazonaws.com", "bucket")
    >>> one = SourceIdentity(domain, ContentIdentity(size=498, etag='"a1"'), "s3://bucket/k")
    >>> two = SourceIdentity(domain, ContentIdentity(size=498, etag='"b2"'), "s3://bucket/k")
    >>> len(one.key), one.key == two.key
    (64, False)
    """

    domain: StorageDomain
    content: ContentIdentity
    location: str
    #: names the entry; computed once, when the identity is made (every read
    #: of an identity uses it: the entry's name, the diagnostics, the events)
    key: str = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        canonical = json.dumps(self.to_record(), sort_keys=True, separators=(",", ":"))
        key = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
        object.__setattr__(self, "key", key)

    def to_record(self) -> dict[str, Any]:
        # Spelled out rather than dataclasses.asdict (a deep copy, 4x slower): the
        # key of every read hashes this. Same fields, so the same keys as ever.
        d, c = self.domain, self.content
        return {
            "domain": {"protocol": d.protocol, "endpoint": d.endpoint, "container": d.container},
            "content": {
                "size": c.size,
                "etag": c.etag,
                "version_id": c.version_id,
                "mtime_ns": c.mtime_ns,
                "inode": c.inode,
            },
            "location": self.location,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SourceIdentity:
        """Inverse of :meth:`to_record`; raises ``KeyError``/``TypeError`` on bad input."""
        return cls(
            domain=StorageDomain(**record["domain"]),
            content=ContentIdentity(**record["content"]),
            location=str(record["location"]),
        )


@dataclasses.dataclass(frozen=True)
class Resolution:
    """Outcome of resolving one source: an identity, or the reason to bypass."""

    size: int | None
    identity: SourceIdentity | None
    bypass_reason: str | None = None


def fs_protocol(fs: Any) -> str:
    protocol = fs.protocol
    return protocol if isinstance(protocol, str) else protocol[0]


def is_local_fs(fs: Any) -> bool:
    return fs is None or isinstance(fs, _local_fs_class())


@functools.cache
def _local_fs_class() -> type:
    """fsspec's local filesystem class (imported once, when first asked)."""
    from fsspec.implementations.local import LocalFileSystem

    return LocalFileSystem


def _endpoint(fs: Any) -> str:
    endpoint = getattr(fs, "endpoint_url", None)
    if not endpoint:
        endpoint = (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url")
    if not endpoint:
        for attr in ("account_name", "project", "host"):
            value = getattr(fs, attr, None)
            if isinstance(value, str) and value:
                endpoint = f"{attr}:{value}"
                break
    return str(endpoint).rstrip("/").lower() if endpoint else "default"


def _clean(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value)
    return None if text in ("", "null", "None") else text


#: local identities by every value they are made of: ``(real path, host, device, inode,
#: size, mtime_ns)``. A pure function of them (its key a SHA-256 of their JSON), so a
#: repeated plan of an unchanged file takes the identity made before.
_LOCAL: BoundedLRU[tuple[str, str, int, int, int, int], SourceIdentity] = BoundedLRU(4096)


#: ``os.open`` flags that open a path without reading it (Linux: ``O_PATH``), or None
_PATH_ONLY = getattr(os, "O_PATH", None)


def _real_stat(path: str) -> tuple[str, os.stat_result]:
    """``(real path, stat)`` of the file on ``path``: its symbolic links resolved, as
    ``os.path.realpath`` resolves them. On Linux one ``open(O_PATH)`` of ``path`` gives
    both, of the one object it opened: the ``fstat`` of the descriptor and the path
    ``/proc/self/fd`` names for it (four system calls, where ``realpath`` takes one
    ``lstat`` per component). Elsewhere, or where that path is not an absolute one of
    a file still linked, ``realpath`` then ``stat``."""
    if _PATH_ONLY is not None:
        try:
            fd = os.open(path, _PATH_ONLY | os.O_CLOEXEC)
        except OSError:
            pass  # the fallback raises what stat finds (no such file, a loop, ...)
        else:
            try:
                st = os.fstat(fd)
                real = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                real = ""  # no /proc: the fallback
            finally:
                os.close(fd)
            if real.startswith("/") and not real.endswith(" (deleted)"):
                return real, st
    real = os.path.realpath(path)
    return real, os.stat(real)


def _local_resolution(path: str, min_age_s: float, now: float | None) -> Resolution:
    real, st = _real_stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise IsADirectoryError(f"{path!r} is not a regular file; the cache reads files only")
    age = (time.time() if now is None else now) - st.st_mtime_ns / 1e9
    if age < min_age_s:
        return Resolution(st.st_size, None, "local_file_too_new")
    made_of = (real, socket.gethostname(), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    identity = _LOCAL.get(made_of)
    if identity is None:
        identity = SourceIdentity(
            domain=StorageDomain("file", made_of[1], f"dev:{st.st_dev}"),
            content=ContentIdentity(size=st.st_size, mtime_ns=st.st_mtime_ns, inode=st.st_ino),
            location=f"file://{real}",
        )
        _LOCAL.put(made_of, identity)
    return Resolution(st.st_size, identity)


def _fs_info(fs: Any, path: str) -> dict[str, Any]:
    # A listing cache must never answer an identity question: ask the store itself,
    # with ``refresh=True`` where the filesystem names that parameter (s3fs, adlfs),
    # else with its listing cache of ``path`` dropped first. Passing ``refresh`` to
    # one that does not name it is not harmless: fsspec's http filesystem hands
    # unknown keywords to its HTTP client, which fails, and the read is reported
    # as a missing file.
    if _names_refresh(fs.__class__):
        return dict(fs.info(path, refresh=True))
    fs.invalidate_cache(path)
    return dict(fs.info(path))


@functools.cache
def _names_refresh(kind: Any) -> bool:
    """Whether filesystem class ``kind``'s ``info`` (its coroutine ``_info`` for an
    async one, which the sync ``info`` wraps) has a ``refresh`` parameter."""
    method = getattr(kind, "_info", None) if getattr(kind, "async_impl", False) else None
    try:
        parameters = inspect.signature(method or kind.info).parameters
    except (TypeError, ValueError):  # no signature to read: ask without it
        return False
    return "refresh" in parameters


def identity_from_info(fs: Any, path: str, info: dict[str, Any]) -> Resolution:
    """Build a :class:`Resolution` from an fsspec ``info`` dict of ``path``."""
    if info.get("type", "file") != "file":
        raise IsADirectoryError(f"{path!r} is not a file; the cache reads files only")
    size = info.get("size")
    if not isinstance(size, int) or size < 0:
        return Resolution(None, None, "no_size")
    etag = _clean(info.get("ETag") or info.get("etag"))
    version = _clean(info.get("VersionId") or info.get("version_id") or info.get("generation"))
    if etag is None and version is None:
        return Resolution(size, None, "no_content_identity")
    return Resolution(size, known_identity(fs, path, size, etag=etag, version_id=version))


def known_identity(
    fs: Any, path: str, size: int, *, etag: str | None = None, version_id: str | None = None
) -> SourceIdentity:
    """The identity of remote object ``path`` on ``fs`` from what the caller knows,
    without a request.

    With an ``etag`` or a ``version_id`` (a listing's), the identity is the one a
    metadata request would prove. With neither, the object is *immutable* (a
    table's data file, which its table never rewrites): its content is known by
    ``size`` alone, and a read of it that finds another size is stale.
    """
    protocol = fs_protocol(fs)
    stripped = fs._strip_protocol(path).lstrip("/")
    container = stripped.split("/", 1)[0]
    return SourceIdentity(
        domain=StorageDomain(protocol, _endpoint(fs), container),
        content=ContentIdentity(size=size, etag=etag, version_id=version_id),
        location=f"{protocol}://{stripped}",
    )


def resolve_identity(
    fs: Any, path: str, *, local_min_age_s: float = 3.0, now: float | None = None
) -> Resolution:
    """Resolve ``path`` on ``fs`` (``None`` or a local fs: the local filesystem).

    Contacts the store once (``stat`` or a metadata request). Missing objects raise
    ``FileNotFoundError``; directories raise ``IsADirectoryError``. Thread-safe.
    """
    if is_local_fs(fs):
        local = path if fs is None else fs._strip_protocol(path)
        return _local_resolution(local, local_min_age_s, now)
    return identity_from_info(fs, path, _fs_info(fs, path))
