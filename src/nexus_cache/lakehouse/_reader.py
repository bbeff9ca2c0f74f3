"""The read handle returned by the lakehouse cache: a seekable binary file.

A local read holds a descriptor opened after the entry was pinned and re-checked;
the descriptor's bytes stay readable for the whole read even if retention or a
``clear`` unlinks the file meanwhile. Byte reads (``read``/``readinto``) copy with
``pread`` straight into the result (one copy, measured faster than slicing a
mapping); the zero-copy paths (``buffer``/``read_buffer``, which pyarrow uses)
memory-map the entry through the same descriptor, mapped on first use. A remote read wraps the
store's file object, opened pinned to the planned identity; a local source read
directly (no root, or a miss) hands out that file's descriptor (``fileno``), so
a decoder can memory-map it as it maps an entry. Either way the handle
carries :class:`~.events.ReadDiagnostics`.

A hit planned from a remembered identity carries its identity ``probe`` (the
deferred identity check: a future of the object's identity now) and the
``planned`` identity: every call that hands out bytes or the descriptor does its
local work (``pread``, mapping) first, then waits for the probe once and
compares, before returning anything, so the remote probe overlaps the local
read but gates its result.

An entry is never rewritten in place, so a local file shorter than the size it
was opened with was truncated from outside: every read then raises
:class:`~nexus_cache.errors.CacheIntegrityError` rather than return short data,
and the zero-copy paths check the size before handing out a view (a mapping
read past a truncated end would fault the process).

**Stale before the first byte.** A handle from :meth:`LakehouseCache.open`
carries a ``replan`` callable. When the object turns out to have changed (the
deferred check fails, or the store refuses a pinned range request) before any
byte, view or descriptor was handed out, the handle plans the read again and
continues on the new object, so callers that never made a plan (pandas,
pyarrow, DuckDB through ``nexus::``) never see :class:`StalePlanError` for
it. To make that safe, ``size`` and ``seek(..., SEEK_END)`` of a deferred hit
wait for the identity check. Once old bytes were returned (or the old size was
seen and the new object's differs), the error is raised: the caller holds data
of the old version and must read again.

Closing releases the pin and the descriptor. Not thread-safe (like any file).
"""

from __future__ import annotations

import io
import logging
import mmap
import os
from collections.abc import Callable
from concurrent.futures import Future
from typing import IO, Any

from nexus_cache.errors import CacheIntegrityError, NoLocalFileError, StalePlanError
from nexus_cache.lakehouse._events import ReadDiagnostics
from nexus_cache.lakehouse.identity._identity import SourceIdentity
from nexus_cache.lakehouse.identity._remote import is_expired_error
from nexus_cache.lakehouse.store._pins import Pin

__all__ = ["LakehouseFile"]

logger = logging.getLogger("nexus_cache.lakehouse")


class LakehouseFile(io.RawIOBase):
    """One object being read: ``read``/``readinto``/``seek``/``tell`` plus diagnostics.

    :meth:`LakehouseCache.open` returns one; it is a binary file object that
    pyarrow, pandas and DuckDB read directly. ``diagnostics`` says how the
    cache answered; ``is_local`` whether the bytes come from a local file.

    Parameters
    ----------
    diagnostics : ReadDiagnostics
        What the read did.
    size : int or None
        The object's size.
    fd, pin, remote, on_close, probe, planned, replan
        The open's internals, set by the cache.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import pyarrow as pa, pyarrow.parquet as pq
    >>> from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = pathlib.Path(tmp.name)
    >>> source = str(root / "data.parquet")
    >>> pq.write_table(pa.table({"x": [1, 2, 3]}), source)
    >>> config = LakehouseCacheConfig(
    ...     root=root / "cache", policy="fill_before_read", max_bytes="64M", local_min_age_s=0
    ... )
    >>> with LakehouseCache(config) as cache, cache.open(source) as f:
    ...     f.read(4), f.seek(-4, 2) == f.size - 4, f.read(), f.is_local
    (b'PAR1', True, b'PAR1', True)
    >>> tmp.cleanup()
    """

    def __init__(
        self,
        diagnostics: ReadDiagnostics,
        size: int | None,
        *,
        fd: int | None = None,
        pin: Pin | None = None,
        remote: IO[bytes] | None = None,
        on_close: Callable[[], None] | None = None,
        probe: Future[SourceIdentity | None] | None = None,
        planned: SourceIdentity | None = None,
        replan: Callable[[], LakehouseFile] | None = None,
        on_stale: Callable[[StalePlanError], None] | None = None,
        local_path: str | None = None,
    ) -> None:
        super().__init__()
        self.diagnostics = diagnostics
        #: the local file holding these bytes (the cache entry, or a local
        #: source read directly); None for a read from a remote store
        self.local_path = local_path
        #: set by :meth:`name_local_file`: ``name`` is then the local file
        self._local_name_of: str | None = None
        self._fd = fd
        self._pin = pin
        self._remote = remote
        self._on_close = on_close
        self._confirm = probe
        self._planned = planned
        self._replan = replan
        self._on_stale = on_stale  # reports the object found stale (event, diagnostics)
        self._handed_out = False  # a byte, view or the descriptor left the handle
        self._size_seen = False  # the caller asked the size (it may size reads by it)
        self._refused: str | None = None
        self._mm: mmap.mmap | None = None
        self._native: Any = None
        self._pos = 0
        if fd is not None:
            self._size = os.fstat(fd).st_size
        else:
            self._size = size if size is not None else _remote_size(remote)

    # -- properties ----------------------------------------------------------
    @property
    def name(self) -> str:
        """The source's location; after :meth:`name_local_file`, the local file."""
        if self._local_name_of is None:
            return self.diagnostics.location
        if self._confirm is not None or self._refused is not None:
            # a deferred hit: the entry is named only once proven to be the object
            self._guarded(self._confirmed, hands_out=False)
        if self.local_path is None:
            d = self.diagnostics
            raise NoLocalFileError(
                f"{self._local_name_of} is read from its store, not from a local file "
                f"(status {d.cache_status.value}, reason {d.reason or '-'}): there is no "
                "local path to name (what fsspec.open_local returns), and a path of the same "
                "name on this machine would be another file. Have the cache hold it first: a "
                "cache root with NEXUS_LAKEHOUSE_CACHE_POLICY=fill_before_read, or "
                "LakehouseCache.prefetch(url); an object without a content identity "
                "(memory://, reason no_content_identity) is never cached: open() it instead"
            )
        return self.local_path

    def name_local_file(self, url: str) -> None:
        """Make ``name`` the local file that holds the bytes (what
        ``fsspec.open_local`` returns): the cache entry, or a local source. A
        read served from a remote store has none: ``name`` then raises
        :class:`~nexus_cache.errors.NoLocalFileError` naming ``url``, never
        returns the object's path, which on this machine is another file."""
        self._local_name_of = url

    @property
    def size(self) -> int:
        if self._confirm is not None or self._refused is not None:
            self._guarded(self._confirmed, hands_out=False)
        self._size_seen = True
        return self._size

    @property
    def is_local(self) -> bool:
        return self._fd is not None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return int(self._guarded(self._fileno))

    def _fileno(self) -> int:
        if self._fd is None:
            if self.local_path is not None and self._remote is not None:
                # a local source read directly: its descriptor, opened and
                # proven at planning (a decoder memory-maps it)
                return int(self._remote.fileno())
            raise io.UnsupportedOperation("a remote read has no file descriptor")
        self._confirmed()  # the descriptor reads the entry's bytes: gate it too
        return self._fd

    def _confirmed(self) -> None:
        """Wait for the deferred identity check; raises :class:`StalePlanError`.

        A failed check stays failed: every later call raises again, so no call
        can slip stale bytes out after the first one was refused.
        """
        if self._confirm is None:
            if self._refused is not None:
                raise StalePlanError(self._refused)
            return
        try:
            try:
                current = self._confirm.result()
            except FileNotFoundError:
                current = None  # the object is gone: stale too
            self._compare(current)
        except StalePlanError as exc:
            self._refused = str(exc)  # reported once (by _compare), refused for good
            raise
        except BaseException as exc:
            # An unanswered probe (network error, ...) proves nothing: later calls
            # must not treat the identity as confirmed.
            where = self.diagnostics.location
            self._refused = (
                f"{where}: the identity check failed ({type(exc).__name__}: {exc}); "
                "plan the read again"
            )
            raise
        finally:
            self._confirm = None

    def _compare(self, current: SourceIdentity | None) -> None:
        """Raise (and report) :class:`StalePlanError` unless ``current`` is the plan's."""
        assert self._planned is not None
        if current is not None and current.key == self._planned.key:
            return
        exc = StalePlanError(
            f"{self._planned.location} changed since it was planned "
            "(identity probe at open); plan the read again"
        )
        if self._on_stale is not None:
            self._on_stale(exc)
        raise exc

    def buffer(self) -> memoryview:
        """Zero-copy view of a local entry (valid until the handle is closed and the
        view released). Remote reads raise ``io.UnsupportedOperation``."""
        return self._guarded(self._buffer)

    def _buffer(self) -> memoryview:
        self._check_open()
        if self._fd is None:
            raise io.UnsupportedOperation("buffer() is only available for local reads")
        self._check_not_truncated()
        mm = self._mapping()
        self._confirmed()
        return memoryview(mm) if mm is not None else memoryview(b"")

    def _mapping(self) -> mmap.mmap | None:
        if self._mm is None and self._fd is not None and self._size:
            self._mm = mmap.mmap(self._fd, self._size, prot=mmap.PROT_READ)
        return self._mm

    def _truncated(self, have: int) -> CacheIntegrityError:
        where = self.diagnostics.location
        return CacheIntegrityError(
            f"the cache entry of {where} was truncated while it was read: it has "
            f"{have} of its {self._size} bytes; no short data was returned. Read it again "
            "(the next plan removes the damaged entry); nothing but nexus-cache should "
            "write under the cache root"
        )

    def _check_not_truncated(self) -> None:
        assert self._fd is not None
        have = os.fstat(self._fd).st_size
        if have < self._size:
            raise self._truncated(have)

    # -- staleness before the first byte ---------------------------------------
    def _guarded(self, op: Callable[..., Any], *args: Any, hands_out: bool = True) -> Any:
        """Run ``op``; on a stale object with nothing handed out yet, re-plan and rerun."""
        try:
            result = op(*args)
        except StalePlanError:
            if not self._replan_now():
                raise
            result = op(*args)
        if hands_out:
            self._handed_out = True
        return result

    def _replan_now(self) -> bool:
        """Switch to a freshly planned handle of the same source; once per handle."""
        replan, self._replan = self._replan, None
        if replan is None or self._handed_out:
            return False
        # This handle's object is stale: its after-read fill must not run
        # (the fresh handle brings its own, and a failed replan needs none).
        self._on_close = None
        fresh = replan()
        if self._size_seen and fresh._size != self._size:
            fresh.close()  # the caller sized its reads by the old object
            return False
        self._release()
        for name in (
            "diagnostics",
            "_fd",
            "_pin",
            "_remote",
            "_on_close",
            "_confirm",
            "_planned",
            "local_path",
        ):
            setattr(self, name, getattr(fresh, name))
            setattr(fresh, name, None)
        self._refused, self._size, self._mm, self._native = None, fresh._size, None, None
        fresh.close()
        if self._remote is not None:
            self._remote.seek(self._pos)
        return True

    # -- reading -------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed LakehouseFile")

    def read(self, size: int | None = -1) -> bytes:
        return self._guarded(self._read, size)

    def _read(self, size: int | None) -> bytes:
        self._check_open()
        if self._remote is not None:
            try:
                data = self._remote.read(-1 if size is None else size)
            except OSError as exc:
                if is_expired_error(exc):
                    what = "was overwritten during the read"
                elif isinstance(exc, FileNotFoundError):
                    # A lazily opened object deleted since it was planned: a
                    # fresh plan asks the store, which says so by name.
                    what = "was deleted since it was planned"
                else:
                    raise
                stale = StalePlanError(f"{self.diagnostics.location} {what}; plan it again")
                if self._on_stale is not None:
                    self._on_stale(stale)
                raise stale from exc
            self._pos += len(data)
            return data
        assert self._fd is not None
        end = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        if end <= self._pos:
            self._confirmed()
            return b""
        data = os.pread(self._fd, end - self._pos, self._pos)
        if len(data) < end - self._pos:  # a short read: finish into one buffer
            buf = bytearray(end - self._pos)
            buf[: len(data)] = data
            got = len(data) + self._pread_into(memoryview(buf)[len(data) :], self._pos + len(data))
            if got < end - self._pos:
                raise self._truncated(self._pos + got)
            data = bytes(buf)
        self._confirmed()
        self._pos += len(data)
        return data

    def _pread_into(self, view: memoryview, offset: int) -> int:
        assert self._fd is not None
        done = 0
        while done < len(view):
            n = os.preadv(self._fd, [view[done:]], offset + done)
            if n == 0:
                break  # end of file
            done += n
        return done

    def read_buffer(self, nbytes: int | None = None) -> memoryview | bytes:
        """Like :meth:`read`, but a local read returns a zero-copy view of the mapping.

        ``pyarrow.PythonFile`` prefers this method when present, so Parquet reads
        of a hit through fsspec or a plain file object copy nothing.
        """
        return self._guarded(self._read_buffer, nbytes)

    def _read_buffer(self, nbytes: int | None) -> memoryview | bytes:
        self._check_open()
        if self._fd is not None:
            self._check_not_truncated()  # before mapping: a view past the end faults
        if self._mapping() is None:
            if self._fd is not None:
                self._confirmed()
                return memoryview(b"")  # an empty entry
            if isinstance(self._remote, io.FileIO):
                return self._native_read_buffer(nbytes)
            return self._read(-1 if nbytes is None else nbytes)
        end = self._size if nbytes is None or nbytes < 0 else min(self._size, self._pos + nbytes)
        self._confirmed()
        start, self._pos = self._pos, max(self._pos, end)
        assert self._mm is not None
        return memoryview(self._mm)[start : max(start, end)]

    def _native_read_buffer(self, nbytes: int | None) -> Any:
        # A local source file (the local-directory remote): let Arrow read it into
        # its own pool through the same, identity-checked descriptor. Not mmap:
        # the source is someone else's file and may be truncated under us.
        import pyarrow as pa

        assert isinstance(self._remote, io.FileIO)
        if self._native is None:
            self._native = pa.OSFile(f"/proc/self/fd/{self._remote.fileno()}", "r")
        self._native.seek(self._pos)
        buf = self._native.read_buffer(None if nbytes is None or nbytes < 0 else nbytes)
        self._pos += buf.size
        return buf

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        return int(self._guarded(self._readinto, buffer))

    def _readinto(self, buffer: Any) -> int:
        self._check_open()
        view = memoryview(buffer).cast("B")
        if self._fd is not None:
            # straight from the descriptor into the caller's buffer: one copy
            want = max(0, min(len(view), self._size - self._pos))
            got = self._pread_into(view[:want], self._pos) if want else 0
            try:
                if got < want:
                    raise self._truncated(self._pos + got)
                self._confirmed()
            except BaseException:
                view[:got] = bytes(got)  # leave no stale byte in the caller's buffer
                raise
            self._pos += got
            return got
        data = self._read(len(view))
        view[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._check_open()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self.size + offset  # waits for a deferred check, like size
        else:
            raise ValueError(f"whence={whence!r}; use 0, 1 or 2")
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        if self._remote is not None:
            self._remote.seek(pos)
        self._pos = pos
        return pos

    def tell(self) -> int:
        self._check_open()
        return self._pos

    # -- closing -------------------------------------------------------------
    def _release(self) -> None:
        """Close the mapping, descriptor and remote file and drop the pin."""
        try:
            if self._mm is not None:
                try:
                    self._mm.close()
                except BufferError:
                    pass  # a caller still holds buffer(); the mapping goes with it
                self._mm = None
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            if self._native is not None:
                self._native.close()
                self._native = None
            if self._remote is not None:
                self._remote.close()
                self._remote = None
        finally:
            if self._pin is not None:
                self._pin.release()
                self._pin = None

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._release()
        finally:
            super().close()
            on_close, self._on_close = self._on_close, None
            if on_close is not None:
                try:
                    on_close()
                except Exception:  # a failed warm-up must not fail the finished read
                    logger.exception(
                        "lakehouse: after-read hook of %s failed", self.diagnostics.location
                    )

    def __repr__(self) -> str:
        d = self.diagnostics
        return (
            f"<LakehouseFile {d.location} {d.cache_status.value}/{d.read_mode.value}"
            f"/{d.fill_mode.value}{' closed' if self.closed else ''}>"
        )


def _remote_size(remote: IO[bytes] | None) -> int:
    size = getattr(remote, "size", None)
    if isinstance(size, int):
        return size
    if remote is not None and hasattr(remote, "fileno"):
        try:
            return os.fstat(remote.fileno()).st_size
        except (OSError, io.UnsupportedOperation):
            pass
    raise ValueError("cannot tell the size of the remote object")
