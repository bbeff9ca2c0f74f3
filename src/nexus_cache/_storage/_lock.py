"""An inter-process lock on a lock file (``fcntl.flock``), also safe between threads."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from types import TracebackType

from nexus_cache._storage._dirs import check_owned_regular
from nexus_cache.errors import LockUsageError

__all__ = ["FileLock"]


class FileLock:
    """Exclusive (or shared) lock held on ``path`` for as long as the holder lives.

        ``flock`` locks belong to an open file description, so the kernel drops
        the lock when the holding process dies: a crash never leaves it stuck.
        One ``FileLock`` object is also a thread lock: a second thread using the
        same object waits for the first to release (even in shared mode). It is
        not reentrant: acquiring twice from one thread raises
    :class:`~nexus_cache.errors.LockUsageError` (a ``RuntimeError``).
        The lock file is created 0600 and must be a regular file we own.
    """

    def __init__(self, path: str | os.PathLike[str], *, shared: bool = False) -> None:
        self.path = os.fspath(path)
        self.shared = shared
        self._thread_lock = threading.Lock()
        self._owner: int | None = None
        self._fd: int | None = None

    @property
    def locked(self) -> bool:
        """Whether this object currently holds the lock."""
        return self._fd is not None

    def acquire(self, timeout: float | None = None) -> bool:
        """Take the lock; ``None`` blocks, ``0`` tries once. Returns whether it was taken."""
        if self._owner == threading.get_ident():
            raise LockUsageError(f"FileLock({self.path!r}) is not reentrant; release it first")
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        if timeout is None:
            self._thread_lock.acquire()
        elif not self._thread_lock.acquire(timeout=max(timeout, 0.0)):
            return False
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except BaseException:
            self._thread_lock.release()
            raise
        try:
            check_owned_regular(self.path, os.fstat(fd))
            op = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
            if deadline is None:
                fcntl.flock(fd, op)
            else:
                delay = 0.0005
                while True:
                    try:
                        fcntl.flock(fd, op | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            os.close(fd)
                            self._thread_lock.release()
                            return False
                        time.sleep(min(delay, left))
                        delay = min(delay * 2, 0.02)
        except BaseException:
            os.close(fd)
            self._thread_lock.release()
            raise
        self._fd = fd
        self._owner = threading.get_ident()
        return True

    def release(self) -> None:
        """Drop the lock. Releasing a lock this object does not hold raises
        :class:`~nexus_cache.errors.LockUsageError` (a ``RuntimeError``)."""
        fd = self._fd
        if fd is None:
            raise LockUsageError(
                f"FileLock({self.path!r}) is not held; call release() once per acquire()"
            )
        self._fd = None
        self._owner = None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
            self._thread_lock.release()

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        mode = "shared" if self.shared else "exclusive"
        return f"FileLock({self.path!r}, {mode}, locked={self.locked})"
