"""Reader pins: sidecar files that keep retention away from entries in use.

A pin is an empty file ``pins/<key>.<host>-<pid>-<start>-<nonce>.pin``. It lives on
disk, so it outlives a reader that crashes; it names its process by pid *and*
process start time, so a pid reused by an unrelated process does not keep a dead
reader's pin alive. A pin whose process is gone is reclaimed (removed) by whoever
lists the pins next. Pins made on another host (a shared cache root) cannot be
judged by pid; they count as live until older than ``foreign_max_age_s``.

Within one process, pins are shared per ``(pins_dir, key)`` and reference-counted in
memory: the first reader of an entry creates its pin file, later readers of the same
entry only bump the count (and refresh the file's mtime, so another host judges
its age from the latest reader), and the last release removes the file. A hot
entry opened over and over thus costs one create and one unlink per burst of
overlapping reads, not per open. The file never outlives the process's last reader
of that entry (no linger), and a crashed process's file is reclaimed as before.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

from nexus_cache._storage import ensure_private_dir, host_tag, pid_alive

__all__ = ["Pin", "create_pin", "live_pins", "process_start_time"]

_SUFFIX = ".pin"


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (Linux ``/proc``), else ``None``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 overall
    except (IndexError, ValueError):
        return None


_start_times: dict[int, int] = {}


def _my_start_time() -> int:
    # keyed by pid so a forked child does not reuse its parent's start time
    pid = os.getpid()
    start = _start_times.get(pid)
    if start is None:
        start = _start_times[pid] = process_start_time(pid) or 0
    return start


class _Shared:
    """The one pin file of this process on one key, with its in-process reader count."""

    __slots__ = ("count", "path")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 1


# (pins_dir, key) -> shared pin file; guarded by _lock. Both are reset in a forked
# child: the parent's files name the parent's pid and are the parent's to remove.
_lock = threading.Lock()
_shared: dict[tuple[str, str], _Shared] = {}


def _reset_after_fork() -> None:
    global _lock
    _lock = threading.Lock()
    _shared.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class Pin:
    """One reader's claim on an entry; :meth:`release` drops it (idempotent).

    Thread-safe. The pin file is shared with this process's other readers of the
    same entry and removed when the last of them releases.
    """

    __slots__ = ("_shared", "_slot", "key", "path")

    def __init__(
        self,
        key: str,
        path: Path | None,
        slot: tuple[str, str] | None = None,
        shared: _Shared | None = None,
    ) -> None:
        self.key = key
        self.path = path
        self._slot = slot
        self._shared = shared

    def release(self) -> None:
        with _lock:
            path, self.path = self.path, None
            shared, self._shared = self._shared, None
            if path is None:
                return
            if shared is not None:
                shared.count -= 1
                if shared.count > 0:
                    return
                if self._slot is not None and _shared.get(self._slot) is shared:
                    del _shared[self._slot]
                path = shared.path
            # unlink under the lock: a concurrent pinner of the key must not join a
            # file that is about to vanish
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def __enter__(self) -> Pin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _new_pin_file(pins_dir: Path, key: str) -> Path:
    start = _my_start_time()
    name = f"{key}.{host_tag()}-{os.getpid()}-{start}-{os.urandom(6).hex()}{_SUFFIX}"
    path = Path(f"{os.fspath(pins_dir)}/{name}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        ensure_private_dir(pins_dir)
        fd = os.open(path, flags, 0o600)
    os.close(fd)
    return path


def create_pin(pins_dir: Path, key: str) -> Pin:
    """Pin ``key``. Thread-safe and process-safe; the pin file survives our crash.

    Joins this process's existing pin file on ``key`` when there is one; if that
    file was removed behind our back (it should not be: our process is alive), a
    new one replaces it.
    """
    slot = (os.fspath(pins_dir), key)
    with _lock:
        shared = _shared.get(slot)
        if shared is not None:
            try:
                os.utime(shared.path)
            except FileNotFoundError:
                shared.path = _new_pin_file(pins_dir, key)
            shared.count += 1
            return Pin(key, shared.path, slot, shared)
        shared = _shared[slot] = _Shared(_new_pin_file(pins_dir, key))
        return Pin(key, shared.path, slot, shared)


def _parse(name: str) -> tuple[str, str, int, int] | None:
    if not name.endswith(_SUFFIX):
        return None
    key, _, rest = name[: -len(_SUFFIX)].partition(".")
    parts = rest.split("-")
    if len(parts) != 4:
        return None
    try:
        return key, parts[0], int(parts[1]), int(parts[2])
    except ValueError:
        return None


def _alive(host: str, pid: int, start: int, mtime: float, foreign_max_age_s: float) -> bool:
    if host != host_tag():
        return time.time() - mtime < foreign_max_age_s
    if not pid_alive(pid):
        return False
    if start == 0:
        return True  # the pinner could not read its start time; trust the pid alone
    return process_start_time(pid) == start


def live_pins(pins_dir: Path, *, foreign_max_age_s: float = 86400.0) -> dict[str, int]:
    """Count live pins per key, removing (reclaiming) pins of dead processes.

    Safe to run concurrently with pinners and other reclaimers.
    """
    counts: dict[str, int] = {}
    try:
        it = os.scandir(pins_dir)
    except FileNotFoundError:
        return counts
    with it:
        for entry in it:
            parsed = _parse(entry.name)
            if parsed is None:
                continue
            key, host, pid, start = parsed
            try:
                mtime = entry.stat(follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue
            if _alive(host, pid, start, mtime, foreign_max_age_s):
                counts[key] = counts.get(key, 0) + 1
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
    return counts
