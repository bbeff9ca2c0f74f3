"""Plan, then execute: the two steps of every lakehouse read.

**Planning** resolves the source's identity (one metadata request), looks the entry
up, applies the policy matrix and records the expected size of a hit. **Execution**
proves the plan still holds: a planned hit is pinned, opened and re-checked
(exists, expected size) and its descriptor stays open for the whole read; a remote
read or a fill opens the object pinned to the planned identity. A vanished or
resized entry, or a remote object whose identity changed, raises
:class:`~nexus_cache.errors.StalePlanError` (and is reported with status ``stale``).
A planned hit never contacts the remote store at execution.

**Planned hits without a request** (:meth:`Scanner.plan_remembered`,
:meth:`Scanner.execute_remembered`): a remote object whose identity is already
proven (see :mod:`._known`) is planned without a metadata request:

* from its entry in a listing the caller just fetched (a dataset read lists the
  prefix anyway): the listing is the proof, so N files cost one LIST, not N
  HEADs, and execution only checks the local entry against the plan;
* from the identity this cache proved last, within ``identity_ttl_s`` (opt-in,
  default 0): no request at all;
* from the identity this cache proved last, older than that (**deferred
  identity check**): the local entry is opened and pinned at once and the
  identity request goes to the cache's small probe pool. The handle does its
  local work first and waits for the answer before handing over any byte; a
  changed identity is reported as ``stale`` like any stale plan, and the handle
  then plans again (its ``replan``) or raises :class:`StalePlanError` at that
  read (see :mod:`._reader`). The request is as fresh as a planning one (it
  starts during ``open``), so the guarantee is the same; only its latency
  overlaps the local work.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from typing import Any

from nexus_cache._storage import stat_key, touch_if_unchanged
from nexus_cache.errors import CacheSecurityError, StalePlanError
from nexus_cache.lakehouse._config import LakehouseCacheConfig
from nexus_cache.lakehouse._events import CacheEvent, EventKind, EventLog, ReadDiagnostics
from nexus_cache.lakehouse._fill import Filler, FillOutcome
from nexus_cache.lakehouse._identity import (
    SourceIdentity,
    fs_protocol,
    is_local_fs,
    resolve_identity,
)
from nexus_cache.lakehouse._known import KnownIdentities, listed_identity
from nexus_cache.lakehouse._pins import Pin
from nexus_cache.lakehouse._policy import decide
from nexus_cache.lakehouse._reader import LakehouseFile
from nexus_cache.lakehouse._remote import open_pinned
from nexus_cache.lakehouse._store import EntryState, EntryStore
from nexus_cache.lakehouse._vocabulary import CacheStatus, FillMode, ReadMode

__all__ = ["ReadPlan", "Scanner", "resolve_source"]

#: called with (fs, path, identity) when a remote read that should warm the cache closes
ScheduleFill = Callable[[Any, str, SourceIdentity], None]
#: opens the same source afresh (a new plan), for a handle found stale early
Replan = Callable[[], LakehouseFile]


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """A planned read. ``expected_size`` is set for a planned hit."""

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
        base = ReadDiagnostics(
            location=self.source,
            cache_status=self.status,
            read_mode=self.read_mode,
            fill_mode=self.fill_mode,
            key=self.key,
            size=self.size,
            reason=self.reason,
        )
        return dataclasses.replace(base, **changes) if changes else base


def resolve_source(
    source: str | os.PathLike[str], fs: Any = None, storage_options: dict[str, Any] | None = None
) -> tuple[Any, str]:
    """``(fs, path)`` for a source; ``fs`` is ``None`` for the local filesystem."""
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
    """Plans and executes reads against one store. Thread-safe."""

    def __init__(
        self,
        config: LakehouseCacheConfig,
        store: EntryStore | None,
        filler: Filler | None,
        events: EventLog,
        schedule_fill: ScheduleFill,
        probes: Executor | None = None,
        no_store_reason: str = "no_root",
    ) -> None:
        self.config = config
        self.store = store
        self.filler = filler
        self.events = events
        self._schedule_fill = schedule_fill
        self.probes = probes
        self._no_store_reason = no_store_reason
        self._known = KnownIdentities()

    # -- planning ------------------------------------------------------------
    def plan(
        self,
        source: str | os.PathLike[str],
        *,
        fs: Any = None,
        storage_options: dict[str, Any] | None = None,
    ) -> ReadPlan:
        fs, path = resolve_source(source, fs, storage_options)
        name = os.fspath(source)
        remote, bypass = ReadMode.REMOTE, CacheStatus.BYPASS
        sent = time.monotonic()
        # Identity is proven with or without a root: the device caches above
        # key decoded frames and graphs by it, and the remote read is pinned
        # to it (a rewrite between plan and read is a stale plan, never a
        # frame of the new bytes under the old key).
        try:
            res = resolve_identity(fs, path, local_min_age_s=self.config.local_min_age_s)
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
        self._known.remember(fs, path, res.identity, sent)
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

    def plan_remembered(
        self,
        source: str | os.PathLike[str],
        *,
        fs: Any = None,
        storage_options: dict[str, Any] | None = None,
        listed_info: Mapping[str, Any] | None = None,
    ) -> tuple[ReadPlan, bool] | None:
        """A read of a remote ``source`` planned without a request: ``(plan, probe)``.

        ``listed_info``: ``source``'s entry in a listing fetched just now, which
        proves its identity. Without it, the identity this cache proved last; a
        hit on it needs a ``probe`` (:meth:`execute_remembered` sends one,
        overlapped) unless proven within ``identity_ttl_s``. A miss needs none:
        its remote read is pinned to the planned identity (:func:`open_pinned`:
        If-Match on the ETag, or the store's own metadata), so an object that
        changed since fails that read, and the handle plans again with a
        request before any byte is handed out. ``None``: plan normally (no
        proven identity, ``READ=disabled``, a bypass). Contacts nothing remote.
        """
        if self.store is None:
            return None
        fs, path = resolve_source(source, fs, storage_options)
        if fs is None:
            return None
        known = self._known.get(fs, path)
        if listed_info is not None:
            identity = listed_identity(fs, path, listed_info, known)
            probe = False
        elif known is not None:
            identity = known.identity
            probe = known.age() >= self.config.identity_ttl_s
        else:
            return None
        if identity is None or (probe and self.probes is None):
            return None
        plan = self._decide(os.fspath(source), fs, path, identity, tidy=False)
        if plan.status is CacheStatus.MISS:
            return plan, False  # the pinned remote read proves the identity
        if plan.status is not CacheStatus.HIT or plan.read_mode is not ReadMode.LOCAL:
            return None
        return plan, probe

    def execute_remembered(
        self, plan: ReadPlan, probe: bool, replan: Replan | None = None
    ) -> LakehouseFile:
        """Execute a plan of :meth:`plan_remembered`: a deferred check, or a planned hit."""
        if probe:
            return self.execute_deferred(plan, replan)
        return self.execute(plan, replan)

    def _decide(
        self, name: str, fs: Any, path: str, identity: SourceIdentity, *, tidy: bool
    ) -> ReadPlan:
        """The one plan path of a known identity: look the entry up, ask the policy.

        ``tidy``: remove a damaged entry on the way (only when the identity was
        proven by a fresh request, not remembered).
        """
        assert self.store is not None
        size = identity.content.size
        state, found = self.store.lookup(identity.key, size)
        if tidy and state.must_refill and found and self.store.remove(identity.key, found):
            reason = (
                f"size {found.size} != {size}"
                if state is EntryState.DAMAGED
                else "not made durable before a reboot"
            )
            self.events.emit(
                CacheEvent(EventKind.ENTRY_REMOVED, identity.key, identity.location, reason=reason)
            )
        d = decide(self.config, size, state is EntryState.PRESENT)
        expected = size if d.status is CacheStatus.HIT else None
        return ReadPlan(
            name, fs, path, identity, size, d.status, d.read_mode, d.fill_mode, d.reason, expected
        )

    def execute_deferred(self, plan: ReadPlan, replan: Replan | None = None) -> LakehouseFile:
        """Execute a remembered hit while its identity is probed concurrently.

        The handle is returned before the probe answers; its first data-returning
        call waits for the answer and, if the object's identity is not the
        planned one, opens the source afresh through ``replan`` (or raises
        :class:`StalePlanError` without one). An entry that cannot be trusted
        (foreign owner) is read remotely instead.
        """
        assert self.probes is not None
        assert plan.identity is not None
        fs, path, planned = plan.fs, plan.path, plan.identity

        def probe() -> SourceIdentity | None:
            return resolve_identity(fs, path, local_min_age_s=0.0).identity

        sent = time.monotonic()
        future: Future[SourceIdentity | None]
        try:
            future = self.probes.submit(probe)
        except RuntimeError:
            # Interpreter shutdown (a read in an atexit handler): executors take
            # no work any more. Ask the store on this thread instead.
            future = Future()
            try:
                future.set_result(probe())
            except Exception as exc:  # confirm() handles it as a probe's
                future.set_exception(exc)

        def confirm() -> None:
            try:
                current = future.result()
            except FileNotFoundError:
                current = None
            except BaseException:
                self._known.remember(fs, path, None, sent)
                raise
            self._known.remember(fs, path, current, sent)
            if current is None or current.key != planned.key:
                exc = StalePlanError(
                    f"{planned.location} changed since it was planned "
                    "(identity probe at open); plan the read again"
                )
                self._record_stale(plan, exc)
                raise exc

        try:
            return self._local(plan, plan.diagnostics(), confirm=confirm, replan=replan)
        except CacheSecurityError as exc:
            future.cancel()  # the remote open below proves the identity itself
            return self._refused(plan, exc, replan)
        except StalePlanError as exc:
            future.cancel()
            self._record_stale(plan, exc)
            raise
        except BaseException:
            future.cancel()
            raise

    def _record_stale(self, plan: ReadPlan, exc: StalePlanError) -> None:
        self.events.record_read(plan.diagnostics(cache_status=CacheStatus.STALE, reason=str(exc)))
        location = plan.identity.location if plan.identity else plan.source
        self.events.emit(CacheEvent(EventKind.STALE_PLAN, plan.key, location, reason=str(exc)))

    # -- execution -----------------------------------------------------------
    def execute(self, plan: ReadPlan, replan: Replan | None = None) -> LakehouseFile:
        """Carry out ``plan``; raises :class:`StalePlanError` when it no longer holds.

        ``replan``: how the handle opens the source afresh when the object turns
        out stale before any byte was handed out (see :mod:`._reader`).
        """
        try:
            if plan.status is CacheStatus.HIT and plan.read_mode is ReadMode.LOCAL:
                try:
                    return self._local(plan, plan.diagnostics(), replan=replan)
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
            return self._remote(plan, plan.diagnostics(), warm=warm, replan=replan)
        except StalePlanError as exc:
            self._record_stale(plan, exc)
            raise

    def _local(
        self,
        plan: ReadPlan,
        diag: ReadDiagnostics,
        pin: Pin | None = None,
        confirm: Callable[[], None] | None = None,
        replan: Replan | None = None,
    ) -> LakehouseFile:
        assert self.store is not None
        assert plan.key is not None
        assert plan.size is not None
        pin = pin or self.store.pin(plan.key)
        try:
            try:
                fd = self.store.open_data(plan.key)
            except FileNotFoundError:
                raise StalePlanError(
                    f"the cache entry of {plan.source} vanished after planning; plan again"
                ) from None
            try:
                st = os.fstat(fd)
                if st.st_size != plan.size:
                    raise StalePlanError(
                        f"the cache entry of {plan.source} has {st.st_size} bytes, "
                        f"planned {plan.size}; plan again"
                    )
                touch_if_unchanged(fd, stat_key(st))  # LRU stamp
                handle = LakehouseFile(
                    diag,
                    plan.size,
                    fd=fd,
                    pin=pin,
                    confirm=confirm,
                    replan=replan,
                    local_path=os.fspath(self.store.data_path(plan.key)),
                )
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            pin.release()
            raise
        self.events.record_read(diag)
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
                followed = plan.diagnostics(cache_status=CacheStatus.MISS_FOLLOWED)
                return self._local(plan, followed, pin=pin, replan=replan)
            if result.entry_ready:
                return self._local(plan, plan.diagnostics(), pin=pin, replan=replan)
        except CacheSecurityError as exc:
            pin.release()  # idempotent: _local may have released it already
            return self._refused(plan, exc, replan)
        except BaseException:
            pin.release()
            raise
        pin.release()
        diag = plan.diagnostics(
            read_mode=ReadMode.REMOTE, reason=f"fill_{result.outcome.value}:{result.reason}"
        )
        return self._remote(plan, diag, warm=False, replan=replan)

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
        diag = plan.diagnostics(
            cache_status=CacheStatus.BYPASS,
            read_mode=ReadMode.REMOTE,
            fill_mode=FillMode.NONE,
            reason="entry_refused",
        )
        return self._remote(plan, diag, warm=False, replan=replan)

    def _remote(
        self, plan: ReadPlan, diag: ReadDiagnostics, *, warm: bool, replan: Replan | None
    ) -> LakehouseFile:
        if plan.identity is not None:
            # a handle that can plan again finds staleness at its first read
            source = open_pinned(plan.fs, plan.path, plan.identity, lazy=replan is not None)
            remote, size = source.file, plan.identity.content.size
        elif plan.fs is None:
            remote, size = open(plan.path, "rb"), None  # noqa: SIM115 (closed by the handle)
        else:
            remote, size = plan.fs.open(plan.path, "rb"), None
        on_close = None
        if warm and plan.identity is not None:
            identity = plan.identity

            def on_close() -> None:
                self._schedule_fill(plan.fs, plan.path, identity)

        def on_stale(exc: StalePlanError) -> None:
            self._record_stale(plan, exc)

        try:
            handle = LakehouseFile(
                diag,
                size,
                remote=remote,
                on_close=on_close,
                replan=replan,
                on_stale=on_stale,
                local_path=plan.path if plan.fs is None else None,
            )
        except BaseException:
            remote.close()
            raise
        self.events.record_read(diag)
        return handle
