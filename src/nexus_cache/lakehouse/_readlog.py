"""Read summaries kept under the cache root, for tools in other processes.

Each process's :class:`~nexus_cache.lakehouse.LakehouseCache` on a root writes
``stats/<host>-<pid>-<nonce>.json`` when it closes and at interpreter exit (when
it served any read): its totals by status, read mode, fill mode and event kind,
and its last reads' diagnostics. :func:`read_stats` merges the files, so
``nexus-cache lakehouse stats`` (or any tool) can show whether reads hit
without being the process that read. Only the newest :data:`KEEP` files are
kept; each is written atomically, so a reader never sees half a file.
Summaries are JSON, parsed with ``json`` only, and a malformed file is skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nexus_cache._env import read
from nexus_cache._storage import atomic_write, ensure_private_dir, host_tag, read_regular
from nexus_cache.errors import ConfigError
from nexus_cache.lakehouse._config import BY_FIELD, ENV_ROOT
from nexus_cache.lakehouse._events import summarize_counts

__all__ = ["KEEP", "RECENT", "SummaryWriter", "read_stats", "write_all"]

#: newest summary files kept per root
KEEP = 64
#: reads' diagnostics kept per summary
RECENT = 50
_NAME_SUFFIX = ".json"


def _stats_dir(root: Path) -> Path:
    return root / "stats"


class SummaryWriter:
    """Writes one cache's summary under its root. Thread-safe.

    ``snapshot`` returns ``(counts, recent read dicts)``; nothing is written
    while it reports no read.
    """

    def __init__(
        self, root: Path, tmp_dir: Path, snapshot: Callable[[], tuple[dict[str, int], list]]
    ) -> None:
        self._root = root
        self._tmp_dir = tmp_dir
        self._snapshot = snapshot
        self._name = _new_name()
        self._lock = threading.Lock()
        with _writers_lock:
            _writers.add(self)

    def write(self) -> None:
        """Write (or rewrite) this cache's summary now; best effort, never raises."""
        if not os.path.isdir(self._root):
            # The root was removed (a temporary cache, e.g. the demo's): writing
            # at exit would recreate it, and leave it behind, for a summary
            # nobody can read.
            return
        counts, recent = self._snapshot()
        if not any(k.startswith("read.") for k in counts):
            return
        doc = {
            "format": "nexus-lakehouse-stats",
            "version": 1,
            "pid": os.getpid(),
            "written_at": time.time(),
            "counts": counts,
            "recent_reads": recent[-RECENT:],
        }
        with self._lock, contextlib.suppress(OSError):
            folder = ensure_private_dir(_stats_dir(self._root))
            atomic_write(
                folder / self._name, json.dumps(doc).encode("utf-8"), tmp_dir=self._tmp_dir
            )
            _prune(folder)

    def _after_fork_in_child(self) -> None:
        # A forked child is another process: under its parent's name its summary
        # and the parent's would overwrite each other. Its lock may have been held.
        self._name = _new_name()
        self._lock = threading.Lock()


def _new_name() -> str:
    return f"{host_tag()}-{os.getpid()}-{os.urandom(4).hex()}{_NAME_SUFFIX}"


def _prune(folder: Path) -> None:
    files = []
    with os.scandir(folder) as it:
        for entry in it:
            if entry.name.endswith(_NAME_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    files.append((entry.stat(follow_symlinks=False).st_mtime, entry.path))
    for _, path in sorted(files)[:-KEEP]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


_writers: weakref.WeakSet[SummaryWriter] = weakref.WeakSet()
_writers_lock = threading.Lock()


def _reset_after_fork() -> None:
    global _writers_lock
    _writers_lock = threading.Lock()
    for writer in list(_writers):
        writer._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_after_fork)


def write_all() -> None:
    """Write every live cache's summary (at interpreter exit, after the fills)."""
    with _writers_lock:
        writers = list(_writers)
    for writer in writers:
        writer.write()


def _load(path: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(read_regular(path))  # a FIFO is refused, not waited on
    except (OSError, ValueError, RecursionError):  # Recursion: deep nesting
        return None
    if not isinstance(doc, dict) or doc.get("format") != "nexus-lakehouse-stats":
        return None
    counts = doc.get("counts")
    recent = doc.get("recent_reads")
    if not isinstance(counts, dict) or not isinstance(recent, list):
        return None
    return doc


def read_stats(root: str | os.PathLike[str] | None = None, *, recent: int = 20) -> dict[str, Any]:
    """Reads of every process that used the cache at ``root``, merged.

    ``root`` defaults to ``NEXUS_LAKEHOUSE_CACHE_ROOT``. Returns ``root``,
    ``processes`` (summaries merged), ``reads`` (by cache status, and
    ``total``), ``read_modes``, ``fill_modes``, ``events`` (by kind) and
    ``recent_reads`` (the last ``recent`` reads' diagnostics, oldest first).
    A process's reads appear once its cache closes or it exits. Raises
    :class:`~nexus_cache.errors.ConfigError` without a root and
    ``FileNotFoundError`` when the root does not exist; creates nothing.

    Parameters
    ----------
    root : str, os.PathLike or None, optional
        The cache root (default: ``NEXUS_LAKEHOUSE_CACHE_ROOT``).
    recent : int, optional
        How many of the latest reads to list.

    Returns
    -------
    dict
        The merged statistics, as above.

    Raises
    ------
    ConfigError
        No root is given or set.
    FileNotFoundError
        The root does not exist.

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
    >>> from nexus_cache.lakehouse import read_stats
    >>> with LakehouseCache(config) as cache:
    ...     _ = cache.read(source), cache.read(source)
    >>> stats = read_stats(root / "cache", recent=1)
    >>> stats["reads"]["miss"], stats["reads"]["hit"], stats["recent_reads"][0]["cache_status"]
    (1, 1, 'hit')
    >>> tmp.cleanup()
    """
    if root is None:
        root = read(BY_FIELD["root"])
        if root is None:
            raise ConfigError(f"{ENV_ROOT} is not set: pass the cache root")
    root = Path(os.path.abspath(os.path.expanduser(os.fspath(root))))
    if not root.is_dir():
        raise FileNotFoundError(2, f"{root} is not a lakehouse cache root; check the path")
    totals: dict[str, int] = {}
    reads: list[dict[str, Any]] = []
    processes = 0
    names: list[str] = []
    with contextlib.suppress(FileNotFoundError), os.scandir(_stats_dir(root)) as it:
        names = [e.path for e in it if e.name.endswith(_NAME_SUFFIX)]
    for path in names:
        doc = _load(path)
        if doc is None:
            continue
        processes += 1
        for key, value in doc["counts"].items():
            if isinstance(key, str) and isinstance(value, int):
                totals[key] = totals.get(key, 0) + value
        reads.extend(r for r in doc["recent_reads"] if isinstance(r, dict))
    reads.sort(key=lambda r: r["time"] if isinstance(r.get("time"), (int, float)) else 0)
    return {
        "root": str(root),
        "processes": processes,
        **summarize_counts(totals),
        "recent_reads": reads[-recent:] if recent > 0 else [],
    }
