"""Walking and evicting the ``entries/`` tree of a file-stream cache.

Layout: ``entries/<2 hex fan-out>/<64 hex name>`` (see
``_integrity.entry_location``), plus ``<name>.sum`` sidecars on filesystems
that keep neither exact timestamps nor user xattrs. Anything else in
the tree is ignored; symlinks, non-files and foreign-owned files are reported
as refused and never followed, counted or removed.
"""

from __future__ import annotations

import os
import stat
from typing import NamedTuple

from nexus_cache._storage import StatKey, UnlinkResult, unlink_if_unchanged
from nexus_cache.program._integrity import SIDECAR_SUFFIX
from nexus_cache.program.filestream import _stamps

__all__ = ["EvictResult", "ScanEntry", "ScanResult", "evict_oldest", "is_entry_name", "scan"]

_HEX = frozenset("0123456789abcdef")


def is_entry_name(name: str) -> bool:
    return len(name) == 64 and _HEX.issuperset(name)


class ScanEntry(NamedTuple):
    path: str
    key: StatKey
    atime_ns: int


class ScanResult(NamedTuple):
    entries: list[ScanEntry]
    total_bytes: int
    refused: list[tuple[str, str]]


def _subdirs(entries_dir: str, refused: list[tuple[str, str]]) -> list[str]:
    out: list[str] = []
    try:
        it = os.scandir(entries_dir)
    except FileNotFoundError:
        return out
    with it:
        for d in it:
            if len(d.name) != 2 or not _HEX.issuperset(d.name):
                continue
            if d.is_symlink():
                refused.append((d.path, "symbolic link"))
            elif d.is_dir(follow_symlinks=False):
                out.append(d.path)
    return out


def scan(entries_dir: str, *, with_stat: bool = True) -> ScanResult:
    """List every entry. Without ``with_stat`` only names are checked (for ``len``)."""
    # This process's queued access stamps land first, so the atimes read
    # below (the LRU order eviction and listings use) include its own reads.
    _stamps.flush()
    uid = os.geteuid()
    entries: list[ScanEntry] = []
    refused: list[tuple[str, str]] = []
    total = 0
    zero = StatKey(0, 0, 0)
    for sub in _subdirs(entries_dir, refused):
        try:
            it = os.scandir(sub)
        except FileNotFoundError:
            continue
        with it:
            for f in it:
                if not is_entry_name(f.name):
                    continue
                if not with_stat:
                    if f.is_file(follow_symlinks=False):
                        entries.append(ScanEntry(f.path, zero, 0))
                    continue
                try:
                    st = f.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISLNK(st.st_mode):
                    refused.append((f.path, "symbolic link"))
                elif not stat.S_ISREG(st.st_mode):
                    refused.append((f.path, "not a regular file"))
                elif st.st_uid != uid:
                    refused.append((f.path, f"owned by uid {st.st_uid}"))
                else:
                    entries.append(
                        ScanEntry(
                            f.path, StatKey(st.st_ino, st.st_size, st.st_mtime_ns), st.st_atime_ns
                        )
                    )
                    total += st.st_size
    return ScanResult(entries, total, refused)


def remove_sidecar(entry_path: str) -> None:
    try:
        os.unlink(entry_path + SIDECAR_SUFFIX)
    except FileNotFoundError:
        pass


class EvictResult(NamedTuple):
    evicted: int  # entries this pass removed itself
    removed_bytes: int  # their bytes
    remaining_bytes: int  # estimate of what is left, crediting concurrent deletes


def evict_oldest(
    result: ScanResult,
    target_bytes: int,
    *,
    aside_dir: str,
    keep: str | None = None,
    sidecars: bool = False,
) -> EvictResult:
    """Remove least-recently-read entries until the store is at most ``target_bytes``.

    Stat-guarded: an entry rewritten since the scan is left alone (it is
    fresh). An entry that a concurrent deleter removed first (``GONE``) is
    credited all the same: its bytes are free, and not crediting them would
    make this pass evict newer entries it does not need to (the over-eviction
    race). ``keep`` (the entry just stored) is never chosen.
    """
    total = result.total_bytes
    evicted = removed = 0
    if total <= target_bytes:
        return EvictResult(0, 0, total)
    for entry in sorted(result.entries, key=lambda e: e.atime_ns):
        if total <= target_bytes:
            break
        if entry.path == keep:
            continue
        outcome = unlink_if_unchanged(entry.path, entry.key, aside_dir=aside_dir)
        if outcome is UnlinkResult.CHANGED:
            continue
        total -= entry.key.size
        if outcome is UnlinkResult.REMOVED:
            evicted += 1
            removed += entry.key.size
            if sidecars:
                remove_sidecar(entry.path)
    return EvictResult(evicted, removed, total)
