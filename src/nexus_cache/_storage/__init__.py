"""On-disk primitives shared by the disk caches (POSIX / Linux only).

Atomic publication (temp, fsync, rename), stat-guarded unlink and touch,
stale-temp sweeping, private directories and inter-process locks. Every
function is thread-safe and process-safe in the sense its docstring states.
The interface and its guarantees are described in ``docs/storage.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:
    from nexus_cache._storage._atomic import atomic_write as atomic_write
    from nexus_cache._storage._atomic import fsync_dir as fsync_dir
    from nexus_cache._storage._atomic import new_temp as new_temp
    from nexus_cache._storage._atomic import publish_temp as publish_temp
    from nexus_cache._storage._atomic import rename_into_place as rename_into_place
    from nexus_cache._storage._atomic import stage_temp as stage_temp
    from nexus_cache._storage._atomic import unlink_quietly as unlink_quietly
    from nexus_cache._storage._atomic import write_all as write_all
    from nexus_cache._storage._dirs import check_owned_regular as check_owned_regular
    from nexus_cache._storage._dirs import ensure_private_dir as ensure_private_dir
    from nexus_cache._storage._dirs import read_regular as read_regular
    from nexus_cache._storage._guard import StatKey as StatKey
    from nexus_cache._storage._guard import UnlinkResult as UnlinkResult
    from nexus_cache._storage._guard import lstat_key as lstat_key
    from nexus_cache._storage._guard import stat_key as stat_key
    from nexus_cache._storage._guard import touch_if_unchanged as touch_if_unchanged
    from nexus_cache._storage._guard import unlink_if_unchanged as unlink_if_unchanged
    from nexus_cache._storage._lock import FileLock as FileLock
    from nexus_cache._storage._names import host_tag as host_tag
    from nexus_cache._storage._sweep import pid_alive as pid_alive
    from nexus_cache._storage._sweep import sweep_stale_temps as sweep_stale_temps

# public name -> module that defines it (imported above for type checkers only)
_EXPORTS: dict[str, str] = {
    "atomic_write": "nexus_cache._storage._atomic",
    "fsync_dir": "nexus_cache._storage._atomic",
    "new_temp": "nexus_cache._storage._atomic",
    "publish_temp": "nexus_cache._storage._atomic",
    "rename_into_place": "nexus_cache._storage._atomic",
    "stage_temp": "nexus_cache._storage._atomic",
    "unlink_quietly": "nexus_cache._storage._atomic",
    "write_all": "nexus_cache._storage._atomic",
    "check_owned_regular": "nexus_cache._storage._dirs",
    "ensure_private_dir": "nexus_cache._storage._dirs",
    "read_regular": "nexus_cache._storage._dirs",
    "StatKey": "nexus_cache._storage._guard",
    "UnlinkResult": "nexus_cache._storage._guard",
    "lstat_key": "nexus_cache._storage._guard",
    "stat_key": "nexus_cache._storage._guard",
    "touch_if_unchanged": "nexus_cache._storage._guard",
    "unlink_if_unchanged": "nexus_cache._storage._guard",
    "FileLock": "nexus_cache._storage._lock",
    "host_tag": "nexus_cache._storage._names",
    "pid_alive": "nexus_cache._storage._sweep",
    "sweep_stale_temps": "nexus_cache._storage._sweep",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
