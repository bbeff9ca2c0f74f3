"""Opening a remote object pinned to a planned identity.

A remote read or a fill must read the bytes of the identity that was planned, not
whatever the object holds now. :func:`open_pinned` opens the object and proves the
opened object still has the planned identity, or raises :class:`StalePlanError`:

* local files: the descriptor's ``fstat`` must match inode, size and ``mtime_ns``;
  :meth:`PinnedSource.recheck` repeats that after a fill to catch in-place writes;
* s3fs: the opened file's own metadata (ETag, version id, size) must match; s3fs
  then sends ``If-Match: <ETag>`` (and the version id on a version-aware
  filesystem) with every range request, so an overwrite during the read fails
  instead of mixing versions;
* other fsspec stores: the opened file's metadata when it exposes some, otherwise
  a fresh ``info``; :meth:`PinnedSource.recheck` asks again after a fill.
"""

from __future__ import annotations

import dataclasses
import io
import os
from typing import IO, Any

from nexus_cache.errors import StalePlanError
from nexus_cache.lakehouse.identity._identity import (
    SourceIdentity,
    _fs_info,
    identity_from_info,
    known_identity,
    resolve_identity,
)

__all__ = ["PinnedSource", "is_expired_error", "open_pinned"]


def is_expired_error(exc: BaseException) -> bool:
    """Whether ``exc`` is s3fs's ``FileExpired`` (an If-Match request met a new object).

    Matched by class name so that s3fs stays an optional import.
    """
    return any(cls.__name__ == "FileExpired" for cls in type(exc).__mro__)


def _stale(identity: SourceIdentity, what: str) -> StalePlanError:
    return StalePlanError(
        f"{identity.location} changed since it was planned ({what}); plan the read again"
    )


def _same_content(identity: SourceIdentity, current: SourceIdentity | None) -> bool:
    """Whether ``current`` proves the planned content.

    Sizes must match, and every field both sides know (ETag, version id) must match,
    with at least one compared: metadata served from a listing lacks version ids,
    and an equal ETag is already proof of equal bytes. An immutable object (planned
    with neither, from a table's metadata) is proven by its size.
    """
    if current is None:
        return False
    want, got = identity.content, current.content
    if want.inode is not None:
        return want == got
    if want.size != got.size:
        return False
    if want.etag is None and want.version_id is None:
        return True  # immutable: the size is all there is to compare
    compared = False
    for field in ("etag", "version_id"):
        a, b = getattr(want, field), getattr(got, field)
        if a is not None and b is not None:
            if a != b:
                return False
            compared = True
    return compared


@dataclasses.dataclass
class PinnedSource:
    """An open remote object known to have the planned identity."""

    file: IO[bytes]
    identity: SourceIdentity
    _fs: Any
    _path: str
    _strong: bool

    def recheck(self) -> None:
        """After reading everything: raise :class:`StalePlanError` if the source moved.

        A no-op where the store itself pins every request (s3fs with an ETag).
        """
        if self._strong:
            return
        if isinstance(self.file, io.FileIO):
            st = os.fstat(self.file.fileno())
            if (st.st_size, st.st_mtime_ns) != (
                self.identity.content.size,
                self.identity.content.mtime_ns,
            ):
                raise _stale(self.identity, "local file written during the read")
            return
        current = _current(self._fs, self._path, self.identity)
        if not _same_content(self.identity, current):
            raise _stale(self.identity, "content identity differs after the read")

    def close(self) -> None:
        self.file.close()


def _current(fs: Any, path: str, planned: SourceIdentity) -> SourceIdentity | None:
    """``path``'s identity now, asked of the store. An immutable plan needs only the
    size, which a store with no ETag nor version id (``memory://``, HTTP) reports too."""
    if planned.content.etag is not None or planned.content.version_id is not None:
        return resolve_identity(fs, path, local_min_age_s=0.0).identity
    size = _fs_info(fs, path).get("size")
    return known_identity(fs, path, size) if isinstance(size, int) else None


def _open_local(identity: SourceIdentity) -> PinnedSource:
    path = identity.location.removeprefix("file://")
    try:
        raw = io.FileIO(path, "rb")
    except FileNotFoundError as exc:
        raise _stale(identity, "file is gone") from exc
    st = os.fstat(raw.fileno())
    expected = identity.content
    found = (st.st_ino, st.st_size, st.st_mtime_ns)
    if found != (expected.inode, expected.size, expected.mtime_ns):
        raw.close()
        raise _stale(identity, "inode, size or mtime differ")
    return PinnedSource(raw, identity, None, path, _strong=False)


def open_pinned(
    fs: Any, path: str, identity: SourceIdentity, *, lazy: bool = False, **open_kwargs: Any
) -> PinnedSource:
    """Open ``path`` on ``fs`` for reading, proven to have ``identity``.

    Raises :class:`StalePlanError` when it does not (or is gone); other errors of
    the store propagate. The caller closes the returned source. ``lazy``: the
    caller handles staleness found at the first read (``FileExpired``), so an
    s3fs file may be pinned to the plan without a metadata request of its own.
    """
    if identity.content.inode is not None:  # a local file's identity (fs is local)
        return _open_local(identity)
    planned = _open_s3_planned(fs, path, identity, open_kwargs) if lazy else None
    if planned is not None:
        return planned
    try:
        return _open_remote(fs, path, identity, open_kwargs)
    except StalePlanError:
        if getattr(fs, "dircache", None) is None:
            raise
    # s3fs takes an opened file's metadata (and the ETag it pins) from its
    # listing cache when it holds the path: a listing older than the object
    # refutes a fresh plan. Drop it and ask the store once more.
    fs.invalidate_cache(path)
    return _open_remote(fs, path, identity, open_kwargs)


def _open_s3_planned(
    fs: Any, path: str, identity: SourceIdentity, open_kwargs: dict[str, Any]
) -> PinnedSource | None:
    """s3fs without version awareness: open on the planned identity, no HEAD of its own.

    s3fs would otherwise ask ``info`` again to learn the size and the ETag it
    pins. Both are the plan's: every GET carries ``If-Match: <planned ETag>``, so
    a changed object fails the read (``FileExpired``: stale) instead of serving
    other bytes. ``None`` where this does not apply (another store, a
    version-aware s3fs, a store without If-Match, an identity without an ETag).
    """
    etag, size = identity.content.etag, identity.content.size
    if (
        etag is None
        or not any(cls.__name__ == "S3FileSystem" for cls in type(fs).__mro__)
        or getattr(fs, "version_aware", False)
        or getattr(fs, "local_expiry_check", False)
    ):
        return None
    try:
        f = fs.open(path, "rb", size=size, **open_kwargs)
    except FileNotFoundError as exc:
        raise _stale(identity, "object is gone") from exc
    try:
        f.details = {"name": fs._strip_protocol(path), "size": size, "type": "file", "ETag": etag}
        f.read_kw = {**(getattr(f, "read_kw", None) or {}), "IfMatch": etag}
    except BaseException:
        f.close()
        raise
    return PinnedSource(f, identity, fs, path, _strong=True)


def _open_remote(
    fs: Any, path: str, identity: SourceIdentity, open_kwargs: dict[str, Any]
) -> PinnedSource:
    try:
        try:
            f = fs.open(path, "rb", **open_kwargs)
        except TypeError:
            f = fs.open(path, "rb")
    except FileNotFoundError as exc:
        raise _stale(identity, "object is gone") from exc
    details = getattr(f, "details", None)
    strong = False
    try:
        if isinstance(details, dict) and (details.get("ETag") or details.get("VersionId")):
            current = identity_from_info(fs, path, details).identity
            # s3fs pins range requests with If-Match on the ETag it opened
            strong = (
                bool((getattr(f, "read_kw", None) or {}).get("IfMatch"))
                or bool(getattr(f, "version_id", None))
                or bool(getattr(fs, "local_expiry_check", False))
            )
        else:
            current = _current(fs, path, identity)
    except FileNotFoundError as exc:
        f.close()
        raise _stale(identity, "object is gone") from exc
    except BaseException:
        f.close()
        raise
    if not _same_content(identity, current):
        f.close()
        raise _stale(identity, "content identity differs")
    return PinnedSource(f, identity, fs, path, _strong=strong)
