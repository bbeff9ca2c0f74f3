"""Bytes this process has already read from disk and verified, kept for fast hits.

A file-stream hit must still prove, every time, that the entry on disk is the
one it read before: one ``lstat`` comparing ``(inode, size, mtime_ns,
ctime_ns)``. A rewrite (new inode), a delete, an in-place modification (new
mtime) or a metadata change such as a stripped integrity xattr or a chown
(new ctime) sends the read back to disk, where the bytes are verified again.
Other processes' atime stamps change the ctime too, which only costs a disk
read. What the memo returns is therefore always bytes that passed the
integrity check and that the entry on disk still stands for.

An entry is admitted on its second read from disk, not its first: a process
that reads each kernel once (the common compile-once pattern) would only pay
for holding memory it never uses again (fresh pages are not free). First
reads are remembered in a fixed table of slots by key hash, as an int mark
per version (nothing kept alive), with no lock: a collision or a race only
forgets a first read (the entry is admitted one read later) or admits one
read early, and admission never decides what is served, only what is kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

__all__ = ["SEEN_SLOTS", "MemoEntry", "VerifiedMemo"]

SEEN_SLOTS = 4096  # first reads remembered (without bytes); a power of two


class MemoEntry:
    __slots__ = ("ctime_ns", "data", "ino", "mtime_ns", "path", "size")

    def __init__(
        self, path: str, ino: int, size: int, mtime_ns: int, ctime_ns: int, data: bytes
    ) -> None:
        self.path = path
        self.ino = ino
        self.size = size
        self.mtime_ns = mtime_ns
        self.ctime_ns = ctime_ns
        self.data = data


class VerifiedMemo:
    """A byte-bounded LRU of :class:`MemoEntry` by cache key; thread-safe."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self._entries: OrderedDict[bytes, MemoEntry] = OrderedDict()
        # The first-read table (see the module docstring): a slot, picked by
        # the reader from a hash of the key, holds the mtime_ns of the
        # version last read once (an entry's mtime carries its check, so
        # versions differ there), 0 when empty. The file-stream read path
        # marks and checks it inline (every first read does), no lock: a
        # slot is one list item.
        self.seen: list[int] = [0] * SEEN_SLOTS
        self._bytes = 0
        self._lock = threading.Lock()
        # The miss test every disk read starts with, as one C call (no frame);
        # a hit then calls touch().
        self.lookup = self._entries.get

    def get(self, path: bytes) -> MemoEntry | None:
        entry = self._entries.get(path)
        if entry is not None:
            self.touch(path)
        return entry

    def touch(self, path: bytes) -> None:
        """Mark the entry of ``path`` most recently used (after a hit through ``lookup``)."""
        # No lock: move_to_end is atomic; an entry dropped since the lookup
        # is simply not moved.
        try:
            self._entries.move_to_end(path)
        except KeyError:
            pass

    def put(self, path: bytes, entry: MemoEntry) -> None:
        size = len(entry.data)
        if size > self.capacity // 4:
            return  # a few huge binaries must not flush everything else
        with self._lock:
            old = self._entries.pop(path, None)
            if old is not None:
                self._bytes -= len(old.data)
            self._entries[path] = entry
            self._bytes += size
            while self._bytes > self.capacity:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= len(dropped.data)

    def discard(self, path: bytes) -> None:
        with self._lock:
            old = self._entries.pop(path, None)
            if old is not None:
                self._bytes -= len(old.data)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.seen[:] = [0] * SEEN_SLOTS
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes
