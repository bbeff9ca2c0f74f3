"""On-disk primitives shared by the disk caches (POSIX / Linux only).

Atomic publication (temp, fsync, rename), stat-guarded unlink and touch,
stale-temp sweeping, private directories and inter-process locks. Every
function is thread-safe and process-safe in the sense its docstring states.
The interface and its guarantees are described in ``docs/storage.md``.
"""

from __future__ import annotations

from nexus_cache._storage._atomic import (
    atomic_write,
    fsync_dir,
    new_temp,
    publish_temp,
    rename_into_place,
    stage_temp,
    unlink_quietly,
    write_all,
)
from nexus_cache._storage._dirs import check_owned_regular, ensure_private_dir
from nexus_cache._storage._guard import (
    StatKey,
    UnlinkResult,
    lstat_key,
    stat_key,
    touch_if_unchanged,
    unlink_if_unchanged,
)
from nexus_cache._storage._lock import FileLock
from nexus_cache._storage._names import host_tag
from nexus_cache._storage._sweep import pid_alive, sweep_stale_temps

__all__ = [
    "FileLock",
    "StatKey",
    "UnlinkResult",
    "atomic_write",
    "check_owned_regular",
    "ensure_private_dir",
    "fsync_dir",
    "host_tag",
    "lstat_key",
    "new_temp",
    "pid_alive",
    "publish_temp",
    "rename_into_place",
    "stage_temp",
    "stat_key",
    "sweep_stale_temps",
    "touch_if_unchanged",
    "unlink_if_unchanged",
    "unlink_quietly",
    "write_all",
]
