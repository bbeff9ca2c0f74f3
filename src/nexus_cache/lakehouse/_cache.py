"""The lakehouse byte cache facade: :class:`LakehouseCache`.

One ``LakehouseCache`` is one service's view of a cache root: it owns the config,
the entry store, the service-wide fill budget, the event log and the background
fills (:mod:`.fill._background`), opens the root and closes it all, and runs
maintenance (prefetch, prune, verify, clear, stats). Every read is
:meth:`Scanner.open <._scan.Scanner.open>`, which plans and executes it from
source to handle. Many processes may use one root at once.

Quick use::

    cache = LakehouseCache(LakehouseCacheConfig(root="/cache", policy="read_through",
                                                max_bytes="100GiB"))
    with cache.open("s3://bucket/data.parquet") as f:   # any fsspec URL or local path
        table = pyarrow.parquet.read_table(f)
        print(f.diagnostics)       # cache_status / read_mode / fill_mode
"""

from __future__ import annotations

import atexit
import errno
import os
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nexus_cache.errors import ConfigError, FillError, StalePlanError
from nexus_cache.lakehouse._config import ENV_ROOT, LakehouseCacheConfig
from nexus_cache.lakehouse._events import CacheEvent, EventKind, EventLog, summarize_counts
from nexus_cache.lakehouse._policy import fill_refusal
from nexus_cache.lakehouse._reader import LakehouseFile
from nexus_cache.lakehouse._readlog import RECENT, SummaryWriter, write_all
from nexus_cache.lakehouse._scan import ReadPlan, Scanner
from nexus_cache.lakehouse.fill._background import BackgroundFills, finish_at_exit
from nexus_cache.lakehouse.fill._fill import Filler
from nexus_cache.lakehouse.fill._limits import FillLimits
from nexus_cache.lakehouse.store._durable import wait_for_syncs
from nexus_cache.lakehouse.store._maintenance import (
    RetentionResult,
    clear_entries,
    enforce_retention,
    verify_all,
)
from nexus_cache.lakehouse.store._store import EntryStore

__all__ = ["LakehouseCache", "default_cache"]

#: errors creating a root that make this cache read remotely instead of failing
_DISK_FULL = {errno.ENOSPC: "enospc", errno.EDQUOT: "edquot"}


class LakehouseCache:
    """Local byte cache of remote objects. Thread-safe; process-safe on one root.

    ``config`` defaults to :meth:`LakehouseCacheConfig.from_env`. ``limits`` lets
    several caches of one service share a fill budget (default: a budget of their
    own from the config). ``on_event`` receives every event and read diagnostics.
    Opening a root sweeps temps left by crashed fills, reclaims dead readers' pins
    and, with ``max_bytes``, runs retention.

    Parameters
    ----------
    config : LakehouseCacheConfig or None, optional
        The cache's settings (default: from ``NEXUS_LAKEHOUSE_*`` variables).
    limits : FillLimits or None, optional
        A fill budget shared with other caches.
    on_event : callable or None, optional
        Called with each :class:`CacheEvent` and :class:`ReadDiagnostics`.

    Raises
    ------
    ConfigError
        ``config`` is None and a ``NEXUS_LAKEHOUSE_*`` variable is not valid.
    CacheSecurityError
        The root is a symlink or a directory of another user.

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
    >>> with LakehouseCache(config) as cache:
    ...     with cache.open(source) as first:
    ...         first.diagnostics.cache_status.value, first.diagnostics.fill_mode.value
    ...     with cache.open(source) as second:
    ...         second.diagnostics.cache_status.value, second.read(4)
    ('miss', 'blocking')
    ('hit', b'PAR1')
    >>> tmp.cleanup()
    """

    def __init__(
        self,
        config: LakehouseCacheConfig | None = None,
        *,
        limits: FillLimits | None = None,
        on_event: Any = None,
    ) -> None:
        self.config = config if config is not None else LakehouseCacheConfig.from_env()
        cfg = self.config
        self.events = EventLog(cfg.event_buffer, on_event, log_reads=cfg.log_reads)
        self.limits = limits or FillLimits(cfg.fill_max_concurrency, cfg.fill_max_host_bytes)
        self.store: EntryStore | None = None
        filler: Filler | None = None
        no_store = "no_root"
        if cfg.root is not None:
            self.store = self._open_root(cfg.root)
            no_store = "root_unavailable"
        if self.store is not None:
            self.store.sweep(older_than_s=cfg.stale_temp_age_s)
            self.store.live_pins()  # reclaims pins of dead readers
            self.store.remove_orphan_records()
            if cfg.max_bytes is not None:
                enforce_retention(self.store, cfg.max_bytes)
            filler = Filler(
                self.store,
                self.limits,
                self.events,
                max_bytes=cfg.max_bytes,
                blocking_timeout_s=cfg.blocking_fill_timeout_s,
            )
        self._filler = filler
        self._summary = None
        if self.store is not None:
            events = self.events
            self._summary = SummaryWriter(
                self.store.root,
                self.store.tmp_dir,
                lambda: (events.counts(), [d.to_dict() for d in events.reads()[-RECENT:]]),
            )
        self._fills = (
            BackgroundFills(filler, self.limits, self.events, exit_wait_s=cfg.fill_exit_wait_s)
            if filler is not None
            else None
        )
        self._scanner = Scanner(cfg, self.store, filler, self._fills, self.events, no_store)
        _caches.add(self)

    def _open_root(self, root: Path) -> EntryStore | None:
        """The store at ``root``; ``None`` (reads go remote, with an event) on a full disk."""
        try:
            return EntryStore(root)
        except NotADirectoryError as exc:
            raise ConfigError(
                f"{ENV_ROOT}={str(root)!r} cannot be a cache directory ({exc}); "
                "point it at a directory"
            ) from exc
        except OSError as exc:
            reason = _DISK_FULL.get(exc.errno or 0)
            if reason is None:
                raise
            self.events.emit(
                CacheEvent(
                    EventKind.ROOT_UNAVAILABLE,
                    None,
                    str(root),
                    reason=reason,
                    error=f"{type(exc).__name__}: {exc}",
                )
            )
            return None

    @classmethod
    def from_env(
        cls, environ: dict[str, str] | None = None, *, on_event: Any = None, **overrides: Any
    ) -> LakehouseCache:
        """A cache configured by the ``NEXUS_LAKEHOUSE_*`` variables (plus ``overrides``)."""
        return cls(LakehouseCacheConfig.from_env(environ, **overrides), on_event=on_event)

    # -- reads ---------------------------------------------------------------
    def plan(
        self,
        source: str | os.PathLike[str],
        *,
        fs: Any = None,
        storage_options: dict[str, Any] | None = None,
    ) -> ReadPlan:
        """Resolve identity and decide hit / miss / bypass (one metadata request)."""
        return self._scanner.plan(source, fs=fs, storage_options=storage_options)

    def plan_known(
        self,
        source: str | os.PathLike[str],
        size: int,
        *,
        etag: str | None = None,
        version_id: str | None = None,
        fs: Any = None,
        storage_options: dict[str, Any] | None = None,
    ) -> ReadPlan:
        """Plan an object whose identity is known already: no metadata request.

        For a remote object whose ``size`` (and ``etag`` or ``version_id``, when
        known) come from a fresh listing, or from a table snapshot's metadata:
        a table's data files are immutable, so their path and size are their
        identity. Execution proves the plan as for :meth:`plan`: a hit checks
        the local entry's size, a remote read or a fill the object's, and
        another size raises :class:`StalePlanError`. Pass only what the store or
        the table says now. A local file is planned with one ``stat`` as by
        :meth:`plan`; a size other than ``size`` raises :class:`StalePlanError`.
        """
        return self._scanner.plan_known(
            source,
            size,
            etag=etag,
            version_id=version_id,
            fs=fs,
            storage_options=storage_options,
        )

    def execute(self, plan: ReadPlan) -> LakehouseFile:
        """Carry out a plan; :class:`StalePlanError` when the entry or object changed."""
        return self._scanner.execute(plan)

    def open(
        self,
        source: str | os.PathLike[str],
        *,
        fs: Any = None,
        storage_options: dict[str, Any] | None = None,
        retries: int = 1,
        listed_info: Mapping[str, Any] | None = None,
    ) -> LakehouseFile:
        """Plan and execute; a stale plan is planned again up to ``retries`` times.

        ``source`` is a local path or any fsspec URL (``s3://b/k``); or pass an
        fsspec filesystem as ``fs`` and a path on it. Close the returned file.

        ``listed_info``: ``source``'s entry (an fsspec info dict) in a listing or
        metadata answer fetched from the store *just now* (a dataset read lists
        its prefix anyway). Its ETag and size prove the identity: a hit then costs
        no request, and execution only checks the local entry. Stale information
        here serves stale bytes: pass only what the store answered moments ago.

        A remote object planned before in this cache whose entry is present opens
        without waiting for its identity request: the request runs concurrently
        and the handle's first read waits for it (none at all while the identity
        is younger than ``identity_ttl_s``). If the object changed, or if the
        store refuses a read because the object was overwritten, before any byte
        was handed out, the handle plans again and serves the new object.
        :class:`StalePlanError` is raised only once bytes of the old object
        were returned (read again then).
        """
        return self._scanner.open(
            source,
            fs=fs,
            storage_options=storage_options,
            retries=retries,
            listed_info=listed_info,
        )

    def read(self, source: str | os.PathLike[str], **kwargs: Any) -> bytes:
        """All bytes of ``source`` (see :meth:`open`).

        A deferred identity check that fails at the read is retried here with a
        fresh plan, within ``retries``: nothing was handed out yet.
        """
        retries = kwargs.get("retries", 1)
        for attempt in range(retries + 1):
            with self.open(source, **kwargs) as f:
                try:
                    return f.read()
                except StalePlanError:
                    if attempt >= retries:
                        raise
        raise AssertionError("unreachable")

    def prefetch(
        self,
        source: str | os.PathLike[str],
        *,
        fs: Any = None,
        storage_options: dict[str, Any] | None = None,
    ) -> bool:
        """Fill ``source``'s entry now, whatever the policy; ``True`` when it is present.

        Returns ``False`` for an object the cache must not hold (no strong
        identity, over ``bypass_bytes``, or over ``max_bytes``: a
        ``fill_skipped`` event says which). Raises :class:`ConfigError` without a root and
        :class:`FillError` when the fill fails or times out.
        """
        if self._filler is None:
            raise ConfigError(self._no_store_message("prefetch into"))
        plan = self.plan(source, fs=fs, storage_options=storage_options)
        if plan.identity is None:
            return False
        refusal = fill_refusal(self.config, plan.identity.content.size)
        if refusal is not None:
            self.events.emit(
                CacheEvent(
                    EventKind.FILL_SKIPPED,
                    plan.identity.key,
                    plan.identity.location,
                    reason=refusal,
                    nbytes=plan.identity.content.size,
                )
            )
            return False
        result = self._filler.blocking(plan.fs, plan.path, plan.identity)
        if not result.entry_ready:
            raise FillError(
                f"prefetch of {plan.identity.location} did not fill: "
                f"{result.outcome.value} ({result.reason}); see the cache's events"
            )
        return True

    # -- background fills ----------------------------------------------------
    def wait_for_fills(self, timeout: float | None = None) -> bool:
        """Wait until no background fill is queued or running, and every entry this
        process published is durable (fsynced, mode 0600); ``False`` on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._fills is not None and not self._fills.wait(timeout):
            return False
        return wait_for_syncs(None if deadline is None else max(0.0, deadline - time.monotonic()))

    # -- maintenance -----------------------------------------------------------
    def _need_store(self) -> EntryStore:
        if self.store is None:
            raise ConfigError(self._no_store_message("manage"))
        return self.store

    def _no_store_message(self, what: str) -> str:
        if self.config.root is None:
            return f"{ENV_ROOT} is not set: there is no cache root to {what}"
        return (
            f"the cache root {self.config.root} could not be created (see the "
            f"root_unavailable event): there is no cache to {what}; free space there"
        )

    def prune(self, max_bytes: int | None = None) -> RetentionResult:
        """Run retention toward ``max_bytes`` (default: the configured target)."""
        target = max_bytes if max_bytes is not None else self.config.max_bytes
        if target is None:
            raise ConfigError("prune needs max_bytes: pass it or set the cache's max_bytes")
        return enforce_retention(self._need_store(), target)

    def verify(self, *, remove: bool = True) -> dict[str, str]:
        """Check every entry against its record (size, digest); remove bad ones."""
        bad = verify_all(self._need_store(), remove=remove)
        for key, problem in bad.items():
            self.events.emit(CacheEvent(EventKind.ENTRY_REMOVED, key, None, reason=problem))
        return bad

    def clear(self) -> tuple[int, int]:
        """Remove every unpinned entry; ``(removed, pinned_kept)``."""
        return clear_entries(self._need_store())

    def stats(self, *, recent: int = 20) -> dict[str, Any]:
        """What this cache did in this process, plus the root's size.

        Keys: ``root``; ``reads`` (by cache status, and ``total``),
        ``read_modes``, ``fill_modes`` and ``events`` (by kind): totals since
        the cache was created; ``recent_reads``: the last ``recent`` reads'
        diagnostics (newest last); ``fills_in_flight``,
        ``fill_host_bytes_in_flight``, ``background_fills_pending``; with a
        root, ``entries`` and ``bytes``; ``counts``: the raw counters.
        Thread-safe; it lists the root's entries (one directory scan).
        """
        fills, host_bytes = self.limits.in_flight()
        counts = self.events.counts()
        out: dict[str, Any] = {
            "root": str(self.store.root) if self.store is not None else None,
            **summarize_counts(counts),
            "recent_reads": [d.to_dict() for d in self.events.reads()[-recent:]]
            if recent > 0
            else [],
            "fills_in_flight": fills,
            "fill_host_bytes_in_flight": host_bytes,
            "background_fills_pending": self._fills.pending() if self._fills else 0,
            "counts": counts,
        }
        if self.store is not None:
            entries = list(self.store.iter_entries())
            out["entries"] = len(entries)
            out["bytes"] = sum(e.size for e in entries)
        return out

    # -- lifetime --------------------------------------------------------------
    def close(self, *, wait: bool = True, timeout: float | None = None) -> None:
        """Stop accepting background fills; with ``wait``, let queued ones finish."""
        if wait:
            self.wait_for_fills(timeout)
        self._scanner.close()  # later opens plan with a request
        if self._fills is not None:
            self._fills.close()
        if self._summary is not None:
            self._summary.write()  # for read_stats() in other processes

    def _after_fork_in_child(self) -> None:
        # A forked child's stats() and read summary are its own reads.
        self.events._after_fork_in_child()
        self._scanner.after_fork_in_child()

    def __enter__(self) -> LakehouseCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        c = self.config
        return (
            f"LakehouseCache(root={str(c.root) if c.root else None!r}, read={c.read.value}, "
            f"policy={c.policy.value}, max_bytes={c.max_bytes})"
        )


def _at_exit() -> None:
    # Scripts exit right after their last read: let queued read_through fills
    # publish (bounded by NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S), then record what
    # every cache did, so that read_stats() in another process sees it all.
    finish_at_exit()
    write_all()


# Registered with threading's exit hooks, not atexit: those run before the
# interpreter shuts concurrent.futures' executors down (a hook of the same kind,
# registered earlier, so it runs after ours). s3fs/aiobotocore schedule work on
# such executors; from an atexit hook a fill would fail with "cannot schedule
# new futures after shutdown". atexit is the fallback where the hook is missing.
_register = getattr(threading, "_register_atexit", atexit.register)
_register(_at_exit)


_caches: weakref.WeakSet[LakehouseCache] = weakref.WeakSet()


def _reset_after_fork() -> None:
    global _default_lock
    # Held by a thread that was opening a root when another forked (opening
    # sweeps temps and runs retention: it can take a while); in the child
    # nothing would ever release it, and default_cache() would hang.
    _default_lock = threading.Lock()
    for cache in list(_caches):
        cache._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_after_fork)

_default: LakehouseCache | None = None
_by_root: dict[Path, LakehouseCache] = {}
_default_lock = threading.Lock()


def default_cache(root: str | os.PathLike[str] | None = None) -> LakehouseCache:
    """The process-wide cache configured from the environment (created on first use).

    With ``root``: the process-wide cache of that directory, configured from the
    environment except for the root (what ``nexus::`` builds for the fsspec
    option ``cache_storage``). Thread-safe; one instance per root per process.

    Parameters
    ----------
    root : str, os.PathLike or None, optional
        A cache root; None: ``NEXUS_LAKEHOUSE_CACHE_ROOT``.

    Returns
    -------
    LakehouseCache
        The process's cache of that root (or of the environment's).

    Raises
    ------
    ConfigError
        A ``NEXUS_LAKEHOUSE_*`` variable is not valid.

    Examples
    --------
    >>> import tempfile
    >>> from nexus_cache.lakehouse import default_cache
    >>> tmp = tempfile.TemporaryDirectory()
    >>> default_cache(tmp.name) is default_cache(tmp.name)
    True
    >>> tmp.cleanup()
    """
    global _default
    with _default_lock:
        if root is None:
            if _default is None:
                _default = LakehouseCache.from_env()
            return _default
        config = LakehouseCacheConfig.from_env(root=root)
        assert config.root is not None
        cache = _by_root.get(config.root)
        if cache is None:
            cache = _by_root[config.root] = LakehouseCache(config)
        return cache
