"""Removal of temp files that crashed writers left behind."""

from __future__ import annotations

import os
import stat
import time

from nexus_cache._storage._names import host_tag, parse_temp_name

__all__ = ["pid_alive", "sweep_stale_temps"]


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (in our pid namespace)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def sweep_stale_temps(tmp_dir: str | os.PathLike[str], *, older_than_s: float = 3600.0) -> int:
    """Remove temps in ``tmp_dir`` older than ``older_than_s`` or made by a dead process.

    The dead-process rule applies only to names made on this host and pid
    namespace (see ``_names``); other temps are judged by age. Files whose
    names we did not make are judged by age too. Never follows symlinks;
    a missing ``tmp_dir`` sweeps nothing. Returns how many files were removed.
    Safe to run concurrently with writers and other sweepers.
    """
    try:
        it = os.scandir(tmp_dir)
    except (FileNotFoundError, NotADirectoryError):
        return 0
    cutoff_ns = time.time_ns() - int(older_than_s * 1e9)
    me = host_tag()
    mypid = os.getpid()
    removed = 0
    with it:
        for entry in it:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                continue
            stale = st.st_mtime_ns < cutoff_ns
            if not stale:
                parsed = parse_temp_name(entry.name)
                if parsed is not None and parsed[0] == me and parsed[1] != mypid:
                    stale = not pid_alive(parsed[1])
            if stale:
                try:
                    os.unlink(entry.path)
                    removed += 1
                except FileNotFoundError:
                    pass
    return removed
