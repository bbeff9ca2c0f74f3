"""Fills: publishing a complete, validated local copy of one remote object.

A fill, for entry key ``K`` of a planned identity:

1. holds ``K``'s inter-process lock, and finds ``K`` still absent (a process that
   waited on the lock finds the entry the first one published, and stops);
2. holds a lease of the service-wide :class:`~.limits.FillLimits`;
3. writes an exclusive temp (``O_EXCL``, 0600) from the remote object opened
   *pinned to the planned identity* (:func:`~.remote.open_pinned`), hashing it
   (XXH3-128) as the bytes arrive, no second pass. A remote object is fetched in
   requests as large as the fill's byte budget allows (``min(size,
   max_host_bytes)``: the bytes the lease already charges), so an object within
   the budget costs one GET, pinned by If-Match / version id, instead of one
   ranged GET per 8 MiB; a local source is copied in 1 MiB ``readinto`` steps
   through one buffer (small enough to stay in the CPU cache: 8 MiB steps cost
   a third more);
4. validates the byte count against the identity's size;
5. writes the identity record, then publishes the temp once by link (a
   published path is never rewritten in place). The entry is published ``0700``
   and made durable (fsync, then ``0600``) by a worker thread afterwards, so no
   reader waits for the disk (:mod:`._durable`); where that is unavailable the
   fill fsyncs before the link;
6. runs retention toward ``max_bytes``.

Any failure leaves no entry: the temp is removed (or swept at the next open after a
crash), a record without data is removed. Failures become ``fill_failed`` events;
disk-full and quota errors are reported as ``enospc``/``edquot``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import io
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from nexus_cache._storage import StatKey, lstat_key, new_temp, publish_temp, stat_key, write_all
from nexus_cache.errors import FillError, StalePlanError
from nexus_cache.lakehouse._config import ENV_ROOT
from nexus_cache.lakehouse._durable import (
    PENDING_MODE,
    Discard,
    can_defer,
    make_durable_later,
)
from nexus_cache.lakehouse._events import CacheEvent, EventKind, EventLog
from nexus_cache.lakehouse._identity import SourceIdentity
from nexus_cache.lakehouse._limits import FillLease, FillLimits
from nexus_cache.lakehouse._maintenance import enforce_retention
from nexus_cache.lakehouse._remote import is_expired_error, open_pinned
from nexus_cache.lakehouse._store import EntryState, EntryStore, format_digest, new_hasher
from nexus_cache.lakehouse._vocabulary import FillMode

__all__ = ["FillOutcome", "FillResult", "Filler"]

logger = logging.getLogger("nexus_cache.lakehouse")

_CHUNK = 1024 * 1024  # write/hash step, and the read step of a local source
#: cap on one remote request; ``None``: the fill's byte budget (tests lower it to
#: exercise multi-request fills, as objects larger than the budget have)
_MAX_REQUEST: int | None = None
_DISK_ERRORS = {errno.ENOSPC: "enospc", errno.EDQUOT: "edquot"}


class FillOutcome(enum.Enum):
    FILLED = "filled"  # we published the entry
    PRESENT = "present"  # it was already there (another process filled it)
    SKIPPED = "skipped"  # not attempted (no budget, fill in progress elsewhere)
    TIMEOUT = "timeout"  # a blocking fill gave up waiting
    FAILED = "failed"  # attempted, failed, nothing left behind


@dataclasses.dataclass(frozen=True)
class FillResult:
    outcome: FillOutcome
    reason: str | None = None
    nbytes: int = 0

    @property
    def entry_ready(self) -> bool:
        return self.outcome in (FillOutcome.FILLED, FillOutcome.PRESENT)


def _write_chunk(fd: int, data: bytes | memoryview) -> None:
    # One seam for fault injection (tests replace it to raise ENOSPC).
    write_all(fd, data)


def _pieces(file: Any, block: int) -> Iterator[memoryview]:
    """The bytes of ``file`` in write/hash steps of at most ``_CHUNK`` bytes.

    A local file is read with ``readinto`` into one reused buffer (each piece
    is valid until the next is asked for; 1 MiB stays in the CPU cache between
    the write and the hash); any other file with ``read(block)``, one store
    request per call, sliced without copying.
    """
    if isinstance(file, io.FileIO):
        view = memoryview(bytearray(_CHUNK))
        while n := file.readinto(view):
            yield view[:n]
        return
    while data := file.read(block):
        whole = memoryview(data)
        for start in range(0, len(whole), _CHUNK):
            yield whole[start : start + _CHUNK]


class Filler:
    """Runs fills for one store under one budget. Thread-safe and process-safe."""

    def __init__(
        self,
        store: EntryStore,
        limits: FillLimits,
        events: EventLog,
        *,
        max_bytes: int | None,
        blocking_timeout_s: float,
    ) -> None:
        self.store = store
        self.limits = limits
        self.events = events
        self.max_bytes = max_bytes
        self.blocking_timeout_s = blocking_timeout_s
        # set once the log has said the root is a file; cleared when it works again
        self._warned_not_a_directory = False

    def _event(self, kind: EventKind, identity: SourceIdentity, mode: FillMode, **kw: Any) -> None:
        self.events.emit(CacheEvent(kind, identity.key, identity.location, mode, **kw))

    def blocking(self, fs: Any, path: str, identity: SourceIdentity) -> FillResult:
        """Fill now, waiting at most ``blocking_timeout_s`` for the lock and the budget.

        Raises :class:`StalePlanError` when the remote object no longer has
        ``identity``; every other failure is an event and a non-ready result.
        """
        mode = FillMode.BLOCKING
        deadline = time.monotonic() + self.blocking_timeout_s
        lock = self.store.lock(identity.key)
        try:
            acquired = lock.acquire(timeout=self.blocking_timeout_s)
        except (FileNotFoundError, NotADirectoryError) as exc:
            return self._root_removed(exc, identity, mode)
        if not acquired:
            self._event(EventKind.FILL_TIMEOUT, identity, mode, reason="lock")
            return FillResult(FillOutcome.TIMEOUT, "lock")
        try:
            if self._present(identity):
                return FillResult(FillOutcome.PRESENT)
            lease = self.limits.acquire(identity.content.size, deadline - time.monotonic())
            if lease is None:
                self._event(EventKind.FILL_TIMEOUT, identity, mode, reason="no_budget")
                return FillResult(FillOutcome.TIMEOUT, "no_budget")
            with lease:
                return self._fill_locked(fs, path, identity, mode)
        finally:
            lock.release()

    def background(
        self, fs: Any, path: str, identity: SourceIdentity, lease: FillLease
    ) -> FillResult:
        """Fill with an already granted ``lease`` (released here); never waits on a lock."""
        mode = FillMode.BACKGROUND
        with lease:
            lock = self.store.lock(identity.key)
            try:
                acquired = lock.acquire(timeout=0)
            except (FileNotFoundError, NotADirectoryError) as exc:
                return self._root_removed(exc, identity, mode)
            if not acquired:
                self._event(EventKind.FILL_SKIPPED, identity, mode, reason="in_progress")
                return FillResult(FillOutcome.SKIPPED, "in_progress")
            try:
                if self._present(identity):
                    return FillResult(FillOutcome.PRESENT)
                try:
                    return self._fill_locked(fs, path, identity, mode)
                except StalePlanError:
                    return FillResult(FillOutcome.FAILED, "stale")
            finally:
                lock.release()

    def _root_removed(self, exc: OSError, identity: SourceIdentity, mode: FillMode) -> FillResult:
        """The root (or part of its layout) was removed, or replaced by a file,
        while this cache used it.

        This fill does not run (the read goes to the source). A removed layout
        is made again, as a new root's is, so the next fill works: a
        ``root_unavailable`` event (reason ``removed``) says so. A root that
        is now a regular file (or holds one in place of its layout) is left
        alone: every fill fails with reason ``root_not_a_directory`` (reads
        still go to the source), with a ``root_unavailable`` event (reason
        ``not_a_directory``) and one warning in the log until the root works
        again. A missing lock file with the layout intact is no removal: it
        is re-raised.
        """
        if self._not_a_directory(exc):
            return self._root_not_a_directory(exc, identity, mode)
        try:
            restored = self.store.restore()
        except OSError as again:  # a full disk, or something else now at the root
            if self._not_a_directory(again):
                return self._root_not_a_directory(again, identity, mode)
            restored, exc = True, FileNotFoundError(f"{exc}; recreating it failed: {again}")
        if not restored:
            raise exc
        self._warned_not_a_directory = False
        self.events.emit(
            CacheEvent(
                EventKind.ROOT_UNAVAILABLE,
                identity.key,
                str(self.store.root),
                mode,
                reason="removed",
                error=f"{type(exc).__name__}: {exc}",
            )
        )
        return FillResult(FillOutcome.FAILED, "root_removed")

    def _not_a_directory(self, exc: OSError) -> bool:
        """True when ``exc`` says a file stands where the root or its layout should be."""
        if isinstance(exc, NotADirectoryError):
            return True
        root = self.store.root
        return os.path.lexists(root) and not os.path.isdir(root)

    def _root_not_a_directory(
        self, exc: OSError, identity: SourceIdentity, mode: FillMode
    ) -> FillResult:
        root = self.store.root
        if not self._warned_not_a_directory:
            self._warned_not_a_directory = True
            logger.warning(
                "lakehouse: the cache root %s (%s) is not a directory (a file is in its "
                "place): nothing is cached and every read goes to its source until that "
                "file is removed (the root is then made again)",
                root,
                ENV_ROOT,
            )
        self.events.emit(
            CacheEvent(
                EventKind.ROOT_UNAVAILABLE,
                identity.key,
                str(root),
                mode,
                reason="not_a_directory",
                error=f"{type(exc).__name__}: {exc}",
            )
        )
        return FillResult(FillOutcome.FAILED, "root_not_a_directory")

    def _present(self, identity: SourceIdentity) -> bool:
        state, found = self.store.lookup(identity.key, identity.content.size)
        if state.must_refill and found is not None:
            # we hold the lock: remove the file so the fill can publish
            self.store.remove_locked(identity.key, found)
            reason = "size_mismatch" if state is EntryState.DAMAGED else "not_durable"
            self._event(EventKind.ENTRY_REMOVED, identity, FillMode.NONE, reason=reason)
        return state is EntryState.PRESENT

    def _fill_locked(
        self, fs: Any, path: str, identity: SourceIdentity, mode: FillMode
    ) -> FillResult:
        key = identity.key
        started = time.monotonic()
        fd, tmp = new_temp(self.store.tmp_dir, prefix="fill-")
        fd_open = True
        record_written = False
        try:
            nbytes, digest = self._copy(fd, fs, path, identity)
            if nbytes != identity.content.size:
                raise FillError(
                    f"fill of {identity.location} read {nbytes} bytes, expected "
                    f"{identity.content.size}; the object changed or the store is inconsistent"
                )
            # Publish first and fsync afterwards, off this thread (see _durable),
            # where a reboot can be told apart; otherwise fsync before the link.
            defer = can_defer()
            record = self.store.make_record(identity, nbytes, digest)
            self.store.write_record(key, record, fsync=not defer)
            record_written = True
            sync_fd = None
            if defer:
                os.fchmod(fd, PENDING_MODE)
                sync_fd = os.dup(fd)
            fd_open = False  # publish_temp closes it, and removes the temp on error
            try:
                publish_temp(fd, tmp, self.store.data_path(key), replace=False, fsync=not defer)
            except BaseException:
                if sync_fd is not None:
                    os.close(sync_fd)
                raise
            if sync_fd is not None:
                make_durable_later(
                    sync_fd,
                    os.fspath(self.store.record_path(key)),
                    self._discarder(identity, stat_key(os.fstat(sync_fd))),
                )
        except BaseException as exc:
            if fd_open:
                os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            if record_written and lstat_key(self.store.data_path(key)) is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.store.record_path(key))
            return self._failed(exc, identity, mode, time.monotonic() - started)
        self._event(
            EventKind.FILL_COMPLETED,
            identity,
            mode,
            nbytes=nbytes,
            duration_s=time.monotonic() - started,
        )
        if self.max_bytes is not None:
            try:
                enforce_retention(self.store, self.max_bytes, protect=(key,))
            except OSError:  # best effort: the fill itself succeeded
                logger.exception("lakehouse: retention after filling %s failed", key)
        return FillResult(FillOutcome.FILLED, nbytes=nbytes)

    def _discarder(self, identity: SourceIdentity, published: StatKey) -> Discard:
        """Removes the entry we published (only that file) when its fsync fails."""

        def discard(error: OSError) -> None:
            # Short lock wait: where the fsync runs on the publishing thread
            # (interpreter shutdown) that thread still holds the lock itself.
            if self.store.remove(identity.key, published, lock_timeout=2.0):
                self._event(
                    EventKind.ENTRY_REMOVED,
                    identity,
                    FillMode.NONE,
                    reason=f"fsync failed: {error}",
                )

        return discard

    def _request_bytes(self, size: int) -> int:
        cap = self.limits.max_host_bytes if _MAX_REQUEST is None else _MAX_REQUEST
        return max(1, min(size, cap))

    def _copy(self, fd: int, fs: Any, path: str, identity: SourceIdentity) -> tuple[int, str]:
        hasher = new_hasher()  # inline: XXH3 hashes 1 MiB in about 0.1 ms
        nbytes = 0
        block = self._request_bytes(identity.content.size)
        # lazy: an overwrite fails the pinned GET (FileExpired), handled below
        source = open_pinned(fs, path, identity, lazy=True, block_size=block, cache_type="none")
        try:
            try:
                for piece in _pieces(source.file, block):
                    _write_chunk(fd, piece)
                    hasher.update(piece)
                    nbytes += len(piece)
            except OSError as exc:
                if is_expired_error(exc):
                    raise StalePlanError(
                        f"{identity.location} changed since it was planned (overwritten during "
                        "the fill: the store refused the GET pinned to it); plan again"
                    ) from exc
                if isinstance(exc, FileNotFoundError):
                    raise StalePlanError(
                        f"{identity.location} was deleted since it was planned; plan again"
                    ) from exc
                raise
            source.recheck()
            return nbytes, format_digest(hasher)
        finally:
            source.close()

    def _failed(
        self, exc: BaseException, identity: SourceIdentity, mode: FillMode, duration: float
    ) -> FillResult:
        if isinstance(exc, (FileNotFoundError, NotADirectoryError)) and not isinstance(
            exc, StalePlanError
        ):
            # the root was removed (or replaced by a file) during the fill: its
            # temp has no directory
            with contextlib.suppress(FileNotFoundError):
                return self._root_removed(exc, identity, mode)
        if isinstance(exc, StalePlanError):
            reason = "stale"
        elif isinstance(exc, FillError):
            reason = "validation"
        elif isinstance(exc, OSError):
            reason = _DISK_ERRORS.get(exc.errno or 0, "io")
        elif isinstance(exc, Exception):
            reason = "error"
        else:
            raise exc  # KeyboardInterrupt, SystemExit: nothing to report, just go
        self._event(
            EventKind.FILL_FAILED,
            identity,
            mode,
            duration_s=duration,
            reason=reason,
            error=f"{type(exc).__name__}: {exc}",
        )
        if isinstance(exc, StalePlanError):
            raise exc
        return FillResult(FillOutcome.FAILED, reason)
