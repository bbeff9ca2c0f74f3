"""Every lakehouse read, from source to handle: :meth:`Scanner.open`.

A read is planned, then executed. **Planning** resolves the source's identity
(one metadata request), looks the entry up, applies the policy matrix and
records the expected size of a hit. **Execution** proves the plan still holds:
a planned hit is pinned, opened and re-checked (exists, expected size) and its
descriptor stays open for the whole read; a remote read or a fill opens the
object pinned to the planned identity. A vanished or resized entry, or a remote
object whose identity changed, raises :class:`~nexus_cache.errors.StalePlanError`
(and is reported with status ``stale``); :meth:`Scanner.open` then plans again.
A planned hit never contacts the remote store at execution.

**Planned without a request**: a remote object whose identity is already proven
(see :mod:`.identity._known`) is planned without a metadata request:

* from its entry in a listing the caller just fetched (a dataset read lists the
  prefix anyway): the listing is the proof, so N files cost one LIST, not N
  HEADs, and execution only checks the local entry against the plan;
* from the identity this cache proved last, within ``identity_ttl_s`` (opt-in,
  default 0): no request at all;
* from the identity this cache proved last, older than that (**deferred
  identity check**): the local entry is opened and pinned at once and the
  identity request goes to the scanner's small probe pool. The handle does its
  local work first and waits for the answer before handing over any byte; a
  changed identity is reported as ``stale`` like any stale plan, and the handle
  then plans again (its ``replan``) or raises :class:`StalePlanError` at that
  read (see :mod:`._reader`). The request is as fresh as a planning one (it
  starts during ``open``), so the guarantee is the same; only its latency
  overlaps the local work.

**Planned from a known identity** (:meth:`Scanner.plan_known`): a table's
data file, whose path and size its snapshot's metadata lists and which the
table never rewrites, is planned with no request at all; a read that finds
another size (the entry's, or the object's when read remotely or filled) is
stale.

The helpers (identity, store, fills, policy, events) answer and return; none
of them calls back into this module.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from nexus_cache.errors import CacheSecurityError, StalePlanError
from nexus_cache.lakehouse._config import LakehouseCacheConfig
from nexus_cache.lakehouse._events import CacheEvent, EventKind, EventLog, ReadDiagnostics
from nexus_cache.lakehouse._policy import decide
from nexus_cache.lakehouse._reader import LakehouseFile
from nexus_cache.lakehouse._vocabulary import CacheStatus, FillMode, ReadMode
from nexus_cache.lakehouse.fill._background import BackgroundFills
from nexus_cache.lakehouse.fill._fill import Filler, FillOutcome
from nexus_cache.lakehouse.identity._identity import (
    SourceIdentity,
    fs_protocol,
    is_local_fs,
    known_identity,
    resolve_identity,
)
from nexus_cache.lakehouse.identity._known import KnownIdentities
from nexus_cache.lakehouse.identity._remote import open_pinned
from nexus_cache.lakehouse.store._pins import Pin
from nexus_cache.lakehouse.store._store import EntryState, EntryStore

__all__ = ["ReadPlan", "Scanner", "resolve_source"]

#: opens the same source afresh (a new plan), for a handle found stale early
Replan = Callable[[], LakehouseFile]


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """A planned read. ``expected_size`` is set for a planned hit.

    :meth:`LakehouseCache.plan` makes one; :meth:`LakehouseCache.execute`
    opens it (a plan whose object changed since is planned again).

    Parameters
    ----------
    source : str
        The source as the caller named it.
    fs : fsspec.AbstractFileSystem or None
        Its filesystem (None: local).
    path : str
        The object's path on ``fs``.
    identity : SourceIdentity or None
        The proven identity (None: not proven; see ``identity_reason``).
    size : int or None
        The object's size.
    status, read_mode, fill_mode : CacheStatus, ReadMode, FillMode
        What the read will do.
    reason : str or None, optional
        Why it bypasses.
    expected_size : int or None, optional
        The entry's size, for a planned hit.
    identity_reason : str or None, optional
        Why ``identity`` is None.

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
    >>> size = pathlib.Path(source).stat().st_size
    >>> with LakehouseCache(config) as cache:
    ...     plan = cache.plan(source)
    ...     plan.status.value, plan.fill_mode.value, plan.size == size
    ...     with cache.execute(plan) as f:
    ...         f.diagnostics.cache_status.value
    ('miss', 'blocking', True)
    'miss'
    >>> tmp.cleanup()
    """

    source: str
    fs: Any
    path: str
    identity: SourceIdentity | None
    size: int | None
    status: CacheStatus
    read_mode: ReadMode
    fill_mode: FillMode
    reason: str | None = None
    expected_size: int | None = None
    #: why ``identity`` is None (``local_file_too_new``, ``no_content_identity``,
    #: ``no_size``); None when the identity is proven
    identity_reason: str | None = None

    @property
    def key(self) -> str | None:
        return None if self.identity is None else self.identity.key

    def diagnostics(self, **changes: Any) -> ReadDiagnostics:
        """The diagnostics of a read of this plan, with ``changes`` to its fields."""
        return ReadDiagnostics(**self.fields(**changes))

    def fields(self, **changes: Any) -> dict[str, Any]:
        """The :class:`ReadDiagnostics` fields of a read of this plan, with ``changes``."""
        fields = {
            "location": self.source,
            "cache_status": self.status,
            "read_mode": self.read_mode,
            "fill_mode": self.fill_mode,
            "key": None if self.identity is None else self.identity.key,
            "size": self.size,
            "reason": self.reason,
        }
        fields.update(changes)
        return fields


def resolve_source(
    source: str | os.PathLike[str], fs: Any = None, storage_options: dict[str, Any] | None = None
) -> tuple[Any, str]:
    """``(fs, path)`` for a source; ``fs`` is ``None`` for the local filesystem.

    Parameters
    ----------
    source : str or os.PathLike
        A local path, ``file://`` or another fsspec URL, or ``nexus::URL``.
    fs : fsspec.AbstractFileSystem or None, optional
        The filesystem to read it with (default: from the URL).
    storage_options : dict or None, optional
        Options for the filesystem the URL names.

    Returns
    -------
    tuple of (fsspec.AbstractFileSystem or None, str)
        The filesystem (None: local) and the path on it.

    Examples
    --------
    >>> from nexus_cache.lakehouse import resolve_source
    >>> resolve_source("/data/facts.parquet")
    (None, '/data/facts.parquet')
    >>> resolve_source("file:///data/facts.parquet")
    (None, '/data/facts.parquet')
    """
    text = os.fspath(source)
    if fs is not None:
        return (None if is_local_fs(fs) else fs), text
    # our own protocol in front names the source behind it (never recurse into
    # the nexus filesystem): nexus::X, and nexus:///abs for a local path
    text = text.removeprefix("nexus::")
    if text.startswith("nexus://"):
        text = text[len("nexus://") :]
    if "://" not in text and "::" not in text:
        return None, text
    import fsspec

    resolved, path = fsspec.core.url_to_fs(text, **(storage_options or {}))
    return (None if is_local_fs(resolved) else resolved), path


class Scanner:
    """Plans and executes the reads of one cache (``store`` None: no root). Thread-safe.

    Owns what a read needs beyond the store: the identities this cache proved
    (:class:`KnownIdentities`) and the pool of deferred identity checks.
    ``fills``: where a ``read_through`` read queues its fill when it closes.
    """

    def __init__(
        self,
        config: LakehouseCacheConfig,
        store: EntryStore | None,
        filler: Filler | None,
        fills: BackgroundFills | None,
        events: EventLog,
        no_store_reason: str = "no_root",
    ) -> None:
        self.config = config
        self.store = store
        self.filler = filler
        self.fills = fills
        self.events = events
        self._no_store_reason = no_store_reason
        self._known = KnownIdentities()
        self._probes = _probe_pool() if store is not None else None
        self._closed = False

    # -- the read --------------------------------------------------------------
    def open(
        self,
        source: str | os.PathLike[str],
        *,
        fs: Any = None,
        storage_options: dict[str, Any] | None = None,
        retries: int = 1,
        listed_info: Mapping[str, Any] | None = None,
        fresh: bool = False,
    ) -> LakehouseFile:
        """Plan and execute a read of ``source``; a stale plan is planned again
        up to ``retries`` times (see :meth:`LakehouseCache.open`).

        ``fresh``: plan with a request, never from a remembered or listed
        identity, and hand out a handle that does not plan again: what a
        handle found stale before its first byte opens in its place.
        """
        # 1. Name the source: (fs, path), fs None for a local file.
        name = os.fspath(source)
        fs_, path = resolve_source(source, fs, storage_options)
        replan: Replan | None = None
        if not fresh:
            replan = functools.partial(
                self.open,
                source,
                fs=fs,
                storage_options=storage_options,
                retries=retries,
                fresh=True,
            )
        # 2. A remote object proven just now (``listed_info``) or before (remembered)
        #    is planned without a request: ``probe`` says whether its hit still
        #    needs its identity request, sent now and awaited before the first byte.
        planned = None if fresh or self._closed else self._remembered(name, fs_, path, listed_info)
        attempt = 0
        while True:
            # 3. Otherwise plan with one metadata request.
            plan, probe = planned if planned is not None else (self._plan(name, fs_, path), False)
            planned = None
            # 4. Execute: a hit opens its entry; fill_before_read fills first; any
            #    other read goes to the store (read_through: its fill queued at close).
            try:
                return self._deferred(plan, replan) if probe else self._execute(plan, replan)
            except StalePlanError as exc:
                # 5. The entry vanished or the object changed since planning: plan again.
                self._record_stale(plan, exc)
                attempt += 1
                if attempt > retries:
                    raise

    def plan(
        self,
        source: str | os.PathLike[str],
        *,
        fs: Any = None,
        storage_options: dict[str, Any] | None = None,
    ) -> ReadPlan:
        """Resolve the identity (one metadata request) and decide hit / miss / bypass."""
        fs, path = resolve_source(source, fs, storage_options)
        return self._plan(os.fspath(source), fs, path)

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
        """Plan a remote object whose identity the caller knows: no request.

        A local file is planned as by :meth:`plan` (one ``stat``), and a size
        other than ``size`` is a :class:`StalePlanError` already.
        """
        name = os.fspath(source)
        fs_, path = resolve_source(source, fs, storage_options)
        if fs_ is None:
            plan = self._plan(name, None, path)
            if plan.size is not None and plan.size != size:
                raise StalePlanError(
                    f"{path} has {plan.size} bytes where {size} were expected (its table's "
                    "metadata says so); the file changed: resolve the table again"
                )
            return plan
        identity = known_identity(fs_, path, size, etag=etag, version_id=version_id)
        if self.store is None:
            return ReadPlan(
                name,
                fs_,
                path,
                identity,
                size,
                CacheStatus.BYPASS,
                ReadMode.REMOTE,
                FillMode.NONE,
                self._no_store_reason,
            )
        return self._decide(name, fs_, path, identity, tidy=True)

    def execute(self, plan: ReadPlan) -> LakehouseFile:
        """Carry out ``plan``; raises :class:`StalePlanError` when it no longer holds."""
        try:
            return self._execute(plan, None)
        except StalePlanError as exc:
            self._record_stale(plan, exc)
            raise

    # -- planning ----------------------------------------------------------------
    def _plan(self, name: str, fs: Any, path: str) -> ReadPlan:
        remote, bypass = ReadMode.REMOTE, CacheStatus.BYPASS
        # Identity is proven with or without a root: the device caches above
        # key decoded frames and graphs by it, and the remote read is pinned
        # to it (a rewrite between plan and read is a stale plan, never a
        # frame of the new bytes under the old key). A remote object's is
        # remembered (for plans without a request) where a root can use it.
        min_age = self.config.local_min_age_s
        try:
            if fs is None or self.store is None:  # a local file, or nothing to plan from
                res = resolve_identity(fs, path, local_min_age_s=min_age)
            else:  # remembered, for plans without a request
                res = self._known.resolve(fs, path, local_min_age_s=min_age)
        except FileNotFoundError as exc:
            if fs is None or fs_protocol(fs) != "memory":
                raise
            raise FileNotFoundError(
                f"memory://{path.lstrip('/')}: no such object in fsspec's memory:// "
                "filesystem, which holds only what this process wrote to it (a new "
                "process, such as a nexus-cache command, finds it empty); read a local "
                "path, file:// or a shared store such as s3://"
            ) from exc
        if self.store is None:
            reason = self._no_store_reason
            return ReadPlan(
                name,
                fs,
                path,
                res.identity,
                res.size,
                bypass,
                remote,
                FillMode.NONE,
                reason,
                identity_reason=res.bypass_reason,
            )
        if res.identity is None:
            return ReadPlan(
                name,
                fs,
                path,
                None,
                res.size,
                bypass,
                remote,
                FillMode.NONE,
                res.bypass_reason,
                identity_reason=res.bypass_reason,
            )
        return self._decide(name, fs, path, res.identity, tidy=True)

    def _remembered(
        self, name: str, fs: Any, path: str, listed_info: Mapping[str, Any] | None
    ) -> tuple[ReadPlan, bool] | None:
        """A read of a remote object planned without a request: ``(plan, probe)``.

        ``listed_info``: the object's entry in a listing fetched just now, which
        proves its identity. Without it, the identity this cache proved last; a
        hit on it needs a ``probe`` (:meth:`_deferred` sends one, overlapped)
        unless proven within ``identity_ttl_s``. A miss needs none: its remote
        read is pinned to the planned identity (:func:`open_pinned`: If-Match
        on the ETag, or the store's own metadata), so an object that changed
        since fails that read, and the handle plans again with a request
        before any byte is handed out. ``None``: plan normally (no root, a
        local file, no proven identity, ``READ=disabled``, a bypass). Contacts
        nothing remote.
        """
        if self.store is None or fs is None:
            return None
        recalled = self._known.recall(fs, path, listed_info, self.config.identity_ttl_s)
        if recalled is None:
            return None
        identity, probe = recalled
        if probe and self._probes is None:
            return None
        plan = self._decide(name, fs, path, identity, tidy=False)
        if plan.status is CacheStatus.MISS:
            return plan, False  # the pinned remote read proves the identity
        if plan.status is not CacheStatus.HIT or plan.read_mode is not ReadMode.LOCAL:
            return None
        return plan, probe

    def _decide(
        self, name: str, fs: Any, path: str, identity: SourceIdentity, *, tidy: bool
    ) -> ReadPlan:
        """The one plan path of a known identity: look the entry up, ask the policy.

        ``tidy``: remove a damaged entry on the way (only when the identity was
        proven by a fresh request, not remembered).
        """
        assert self.store is not None
        size = identity.content.size
        if tidy:
            state, removed = self.store.lookup_tidy(identity.key, size)
            if removed is not None:
                self.events.emit(
                    CacheEvent(
                        EventKind.ENTRY_REMOVED, identity.key, identity.location, reason=removed
                    )
                )
        else:
            state, _ = self.store.lookup(identity.key, size)
        d = decide(self.config, size, state is EntryState.PRESENT)
        expected = size if d.status is CacheStatus.HIT else None
        return ReadPlan(
            name, fs, path, identity, size, d.status, d.read_mode, d.fill_mode, d.reason, expected
        )

    # -- execution -----------------------------------------------------------------
    def _execute(self, plan: ReadPlan, replan: Replan | None) -> LakehouseFile:
        """Carry out ``plan``: a hit, a blocking fill, or a remote read.

        ``replan``: how the handle opens the source afresh when the object turns
        out stale before any byte was handed out (see :mod:`._reader`).
        """
        if plan.status is CacheStatus.HIT and plan.read_mode is ReadMode.LOCAL:
            try:
                return self._local(plan, replan=replan)
            except CacheSecurityError as exc:
                return self._refused(plan, exc, replan)
        if plan.fill_mode is FillMode.BLOCKING:
            return self._blocking(plan, replan)
        if plan.reason == "too_large" and plan.identity is not None:
            self.events.emit(
                CacheEvent(
                    EventKind.FILL_SKIPPED,
                    plan.key,
                    plan.identity.location,
                    reason="too_large",
                    nbytes=plan.size or 0,
                )
            )
        warm = plan.fill_mode is FillMode.BACKGROUND
        return self._remote(plan, warm=warm, replan=replan)

    def _deferred(self, plan: ReadPlan, replan: Replan | None) -> LakehouseFile:
        """Execute a remembered hit while its identity is probed concurrently.

        The handle is returned before the probe answers; its first data-returning
        call waits for the answer and, if the object's identity is not the
        planned one, opens the source afresh through ``replan`` (or raises
        :class:`StalePlanError` without one). An entry that cannot be trusted
        (foreign owner) is read remotely instead.
        """
        assert self._probes is not None
        assert plan.identity is not None
        fs, path = plan.fs, plan.path

        def probe() -> SourceIdentity | None:
            return self._known.resolve(fs, path, local_min_age_s=0.0).identity

        future: Future[SourceIdentity | None]
        try:
            future = self._probes.submit(probe)
        except RuntimeError:
            # Interpreter shutdown (a read in an atexit handler): executors take
            # no work any more. Ask the store on this thread instead.
            future = Future()
            try:
                future.set_result(probe())
            except Exception as exc:  # confirm() handles it as a probe's
                future.set_exception(exc)

        try:
            return self._local(plan, probe=future, replan=replan)
        except CacheSecurityError as exc:
            future.cancel()  # the remote open below proves the identity itself
            return self._refused(plan, exc, replan)
        except BaseException:
            future.cancel()
            raise

    def _record_stale(self, plan: ReadPlan, exc: StalePlanError) -> None:
        self.events.record_read(**plan.fields(cache_status=CacheStatus.STALE, reason=str(exc)))
        location = plan.identity.location if plan.identity else plan.source
        self.events.emit(CacheEvent(EventKind.STALE_PLAN, plan.key, location, reason=str(exc)))

    def _local(
        self,
        plan: ReadPlan,
        changes: dict[str, Any] | None = None,
        pin: Pin | None = None,
        probe: Future[SourceIdentity | None] | None = None,
        replan: Replan | None = None,
    ) -> LakehouseFile:
        """A handle on the planned entry; ``changes``: to the plan's diagnostics.

        ``probe``: the identity request of a deferred check, which the handle
        awaits and compares with the plan's before handing out anything.
        """
        assert self.store is not None
        assert plan.key is not None
        assert plan.size is not None
        entry = self.store.open_entry(plan.key, plan.size, plan.source, pin=pin)
        diag = self.events.record_read(**plan.fields(**(changes or {})))
        try:
            handle = LakehouseFile(
                diag,
                plan.size,
                fd=entry.fd,
                pin=entry.pin,
                probe=probe,
                planned=plan.identity if probe is not None else None,
                replan=replan,
                on_stale=functools.partial(self._record_stale, plan) if probe else None,
                local_path=entry.path,
            )
        except BaseException:
            entry.close()
            raise
        return handle

    def _blocking(self, plan: ReadPlan, replan: Replan | None) -> LakehouseFile:
        assert self.store is not None
        assert self.filler is not None
        assert plan.identity is not None
        # pin first, so retention after our own fill cannot take the entry away
        pin = self.store.pin(plan.identity.key)
        try:
            result = self.filler.blocking(plan.fs, plan.path, plan.identity)
            if result.outcome is FillOutcome.PRESENT:
                # another reader's fill published it while we waited on the lock
                followed = {"cache_status": CacheStatus.MISS_FOLLOWED}
                return self._local(plan, followed, pin=pin, replan=replan)
            if result.entry_ready:
                return self._local(plan, pin=pin, replan=replan)
        except CacheSecurityError as exc:
            pin.release()  # idempotent: _local may have released it already
            return self._refused(plan, exc, replan)
        except BaseException:
            pin.release()
            raise
        pin.release()
        reason = f"fill_{result.outcome.value}:{result.reason}"
        changes = {"read_mode": ReadMode.REMOTE, "reason": reason}
        return self._remote(plan, changes, warm=False, replan=replan)

    def _refused(
        self, plan: ReadPlan, exc: CacheSecurityError, replan: Replan | None
    ) -> LakehouseFile:
        """Serve a read remotely because its entry cannot be trusted (foreign owner, ...).

        Reported twice: an ``entry_refused`` event with the reason, and the read's
        diagnostics (status ``bypass``, reason ``entry_refused``). The entry stays
        for ``verify`` to list and remove; a fill cannot replace it meanwhile.
        """
        location = plan.identity.location if plan.identity else plan.source
        self.events.emit(CacheEvent(EventKind.ENTRY_REFUSED, plan.key, location, reason=str(exc)))
        changes = {
            "cache_status": CacheStatus.BYPASS,
            "read_mode": ReadMode.REMOTE,
            "fill_mode": FillMode.NONE,
            "reason": "entry_refused",
        }
        return self._remote(plan, changes, warm=False, replan=replan)

    def _remote(
        self,
        plan: ReadPlan,
        changes: dict[str, Any] | None = None,
        *,
        warm: bool,
        replan: Replan | None,
    ) -> LakehouseFile:
        """A handle on the object in its store; ``changes``: to the plan's diagnostics."""
        if plan.identity is not None:
            # a handle that can plan again finds staleness at its first read
            source = open_pinned(plan.fs, plan.path, plan.identity, lazy=replan is not None)
            remote, size = source.file, plan.identity.content.size
        elif plan.fs is None:
            remote, size = open(plan.path, "rb"), None  # noqa: SIM115 (closed by the handle)
        else:
            remote, size = plan.fs.open(plan.path, "rb"), None
        on_close = None
        if warm and plan.identity is not None and self.fills is not None:
            on_close = functools.partial(self.fills.schedule, plan.fs, plan.path, plan.identity)
        diag = self.events.record_read(**plan.fields(**(changes or {})))
        try:
            handle = LakehouseFile(
                diag,
                size,
                remote=remote,
                on_close=on_close,
                replan=replan,
                on_stale=functools.partial(self._record_stale, plan),
                local_path=plan.path if plan.fs is None else None,
            )
        except BaseException:
            remote.close()
            raise
        return handle

    # -- lifetime --------------------------------------------------------------------
    def close(self) -> None:
        """Later opens plan with a request (no probe pool: no deferred checks)."""
        self._closed = True
        if self._probes is not None:
            self._probes.shutdown(wait=False, cancel_futures=False)

    def after_fork_in_child(self) -> None:
        # The probe threads stayed in the parent but the executor's count of
        # idle ones did not: a child's probe would wait in the queue for a
        # thread that does not exist, and its read with it, forever.
        if self._probes is not None and not self._closed:
            self._probes = _probe_pool()


def _probe_pool() -> ThreadPoolExecutor:
    # Identity probes of deferred checks (see Scanner._deferred): a few threads
    # suffice since each waits on one metadata request; idle threads are only
    # created on demand by the executor.
    return ThreadPoolExecutor(max_workers=4, thread_name_prefix="nexus-lakehouse-probe")
