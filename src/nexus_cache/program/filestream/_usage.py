"""A byte counter shared by every process that uses one file-stream cache.

The counter is 8 bytes in ``<root>/usage``, read and updated under ``flock``
on that same file; each update opens its own descriptor, so threads and
processes exclude each other alike and a crashed holder releases the lock.
It is an estimate: deltas are applied after the fact (stores by capped
objects only; see :meth:`UsageCounter.forget`), and crashes or out-of-band
deletes make it drift. Every eviction scan (see _evictq) corrects it, so
drift never outlives the next scan.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
from collections.abc import Callable

from nexus_cache._storage import check_owned_regular
from nexus_cache.errors import CacheSecurityError

__all__ = ["HeldCounter", "UsageCounter"]

_VALUE = struct.Struct("<q")
_FLAGS = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


def _refuse(path: str, what: str) -> CacheSecurityError:
    return CacheSecurityError(
        f"{path} is {what}, not the cache's byte counter file; refusing to use it. "
        "Remove it: the counter is rebuilt from a scan of the entries."
    )


class HeldCounter:
    """The counter while its lock is held (see :meth:`UsageCounter.hold`)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    def read(self) -> int | None:
        if self.fd is None:
            return None
        raw = os.pread(self.fd, _VALUE.size, 0)
        return _VALUE.unpack(raw)[0] if len(raw) == _VALUE.size else None

    def add(self, delta: int) -> int | None:
        """Add ``delta``; the new total, or ``None`` when the counter is not set up."""
        fd, now = self.fd, self.read()
        if fd is None or now is None:
            return None
        total = max(0, now + delta)
        if delta:
            os.pwrite(fd, _VALUE.pack(total), 0)
        return total

    def set(self, total: int) -> None:
        if self.fd is not None:
            os.pwrite(self.fd, _VALUE.pack(max(0, total)), 0)

    def __enter__(self) -> HeldCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # drops the lock
            self.fd = None


class UsageCounter:
    def __init__(self, path: str) -> None:
        self.path = path
        self._forgotten_ns: int | None = None

    def forget(self, every_ns: int) -> None:
        """For a store by an uncapped object: remove the counter, at most once per ``every_ns``.

        An uncapped object has no cap to enforce, so its stores skip the
        counter's flocked read-modify-write (~5-8 us each). Removing the
        counter instead makes the next capped store anywhere rebuild it from
        a scan (:meth:`initialise`), so a capped object sharing the root
        undercounts uncapped stores by at most ``every_ns`` worth, and every
        eviction pass folds the scan's truth in anyway. Removals (rare, off
        the hot path) still subtract through :meth:`add` when the counter
        exists, so a concurrent deleter's bytes are accounted for exactly.
        Thread-safe: a race at worst removes the file twice.
        """
        now = time.monotonic_ns()
        last = self._forgotten_ns
        if last is not None and now - last < every_ns:
            return
        self._forgotten_ns = now
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise _refuse(self.path, "a directory") from None
        except PermissionError as exc:  # EPERM: unlink of a directory on some systems
            if os.path.isdir(self.path):
                raise _refuse(self.path, "a directory") from None
            raise exc

    def _open(self, create: bool) -> int | None:
        try:
            fd = os.open(self.path, _FLAGS | (os.O_CREAT if create else 0), 0o600)
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise _refuse(self.path, "a directory") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refuse(self.path, "a symbolic link") from None
            raise
        try:
            check_owned_regular(self.path, os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        return fd

    def hold(self) -> HeldCounter:
        """The counter, locked (``flock``) until the returned object's ``with`` ends.

        Wrap a change to the entries together with its delta so that no other
        capped process changes the same entry between the two. A missing
        counter yields a handle whose ``add`` returns ``None``.
        """
        fd = self._open(create=False)
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
        return HeldCounter(fd)

    def add(self, delta: int) -> int | None:
        """Add ``delta``; return the new total, or ``None`` when the counter is not set up."""
        if delta == 0:
            return self.read()
        fd = self._open(create=False)
        if fd is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, _VALUE.size, 0)
            if len(raw) != _VALUE.size:
                return None  # being initialised by someone else's scan
            total = max(0, _VALUE.unpack(raw)[0] + delta)
            os.pwrite(fd, _VALUE.pack(total), 0)
            return total
        finally:
            os.close(fd)  # drops the lock

    def read(self) -> int | None:
        fd = self._open(create=False)
        if fd is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            raw = os.pread(fd, _VALUE.size, 0)
        finally:
            os.close(fd)
        return _VALUE.unpack(raw)[0] if len(raw) == _VALUE.size else None

    def initialise(self, scan_total: Callable[[], int]) -> int:
        """Create the counter from ``scan_total()`` unless another process already has."""
        fd = self._open(create=True)
        assert fd is not None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, _VALUE.size, 0)
            if len(raw) == _VALUE.size:
                return _VALUE.unpack(raw)[0]
            total = int(scan_total())
            os.pwrite(fd, _VALUE.pack(total), 0)
            return total
        finally:
            os.close(fd)
