"""What :meth:`QueryService.execute` returns: an Arrow table plus diagnostics.

:class:`Diagnostics` are shared with :meth:`QueryService.execute_on_device`,
whose result stays in device memory
(:class:`~nexus_cache.service.device_result.DeviceQueryResult`).
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from nexus_cache.errors import LifecycleError

if TYPE_CHECKING:
    from nexus_cache.frames import DeviceFrame

__all__ = [
    "AttemptRecord",
    "Diagnostics",
    "QueryResult",
    "defer_device_fingerprint",
    "defer_evidence_digest",
    "defer_fingerprint",
    "tables_match",
]


@dataclasses.dataclass(frozen=True)
class AttemptRecord:
    """One attempt of a query: its grant, how it ended, its sealed evidence digest.

    Parameters
    ----------
    attempt_id : str
        The attempt's id (``<query id>-<n>``), also its evidence file's name.
    device_id : int or None
        The device it ran on (None: refused before a device was chosen).
    grant_bytes, used_bytes : int
        The memory grant it was admitted under, and what it used of it.
    outcome : str
        ``ok``, ``retried``, ``refused`` or ``failed``.
    error : str or None
        The error that ended it, when one did.
    evidence_digest : str
        The SHA-256 seal of its evidence document. Where the service writes no
        evidence (no ``evidence_dir``), nothing records the document, so it is
        sealed alone (not chained to the attempt before) when this is first read,
        and then kept; the document shares the diagnostics' dicts, so edits made
        to them before that first read are sealed with it.

    Examples
    --------
    >>> from nexus_cache.service import AttemptRecord
    >>> record = AttemptRecord("q1-1", 0, 1 << 20, 128, "ok", None, "ab12")
    >>> record.to_dict()["outcome"]
    'ok'
    """

    attempt_id: str
    device_id: int | None
    grant_bytes: int
    used_bytes: int
    outcome: str  # ok | retried | refused | failed
    error: str | None
    evidence_digest: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __getstate__(self) -> dict[str, Any]:
        # a pickled copy carries the digest, not the document it is computed from
        state = dict(self.__dict__)
        state[_DIGEST] = self.evidence_digest
        return state


@dataclasses.dataclass(frozen=True, repr=False)
class Diagnostics:
    """How a query ran, taken from its last attempt (``attempts`` lists them all).

    ``lakehouse``: ``status`` (hit, miss, bypass, stale, or ``mixed(...)`` over
    several objects), ``read_mode``, ``fill_mode``, ``objects`` and ``read``
    (False when the source cache served the scan, so no byte was read).
    ``source_cache`` and ``graph_cache``: ``status`` and ``reason``.
    ``timings``: seconds per step and ``total_s``. ``algorithm``: a graph
    query's run facts (PageRank: ``iterations``, ``converged``, ``error``,
    the last L1 change, and ``threshold``, what it had to drop below; BFS:
    ``levels``); empty for scans and counts. ``table``: for a scan of a table
    (a filter, an ``as_of``, or a Hive, Delta or Iceberg source), the
    snapshot ``kind`` and ``version`` read, the canonical ``filter`` and its
    ``filter_digest``, the ``projected_columns`` decoded, the pruning counts
    (``objects_planned``, ``pruned_by_partition``, ``pruned_by_statistics``,
    ``row_groups_pruned`` of ``row_groups_total``, ``row_groups_all_true``: kept
    row groups whose statistics prove every row passes, ``objects_mask_skipped``:
    objects read with no mask for it), ``rows_before_filter`` /
    ``rows_after_filter`` and the per-object ``entries``; None for other scans.

    Parameters
    ----------
    query_id : str
        The query's id, shared by its attempts.
    query : dict
        The query in its JSON form.
    device_id : int
        The device of the last attempt.
    attempts : tuple of AttemptRecord
        Every attempt, in order.
    lakehouse, source_cache, graph_cache : dict
        What each cache did, as above.
    timings : dict of str to float
        Seconds per step and ``total_s``.
    rows : int
        The result's row count.
    result_fingerprint : str
        :func:`table_fingerprint` of the result. Where the service writes no
        evidence (no ``evidence_dir``) it is computed when first read (then
        kept), so a query whose fingerprint nobody reads does not hash its
        result; until then the diagnostics hold a reference to the result
        table. Where the service writes evidence, the evidence records it and
        it is computed before ``execute`` returns.
    algorithm : dict, optional
        A graph query's run facts.
    table : dict or None, optional
        A table read's snapshot, filter, pruning and row counts.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import pyarrow as pa, pyarrow.parquet as pq
    >>> from nexus_cache.lakehouse import LakehouseCacheConfig
    >>> from nexus_cache.service import QueryService, Scan, ServiceConfig
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = pathlib.Path(tmp.name)
    >>> edges = pa.table({"src": [1, 2, 3, 3], "dst": [2, 3, 1, 4]})
    >>> pq.write_table(edges, root / "edges.parquet")
    >>> config = ServiceConfig(
    ...     backend="host",
    ...     lakehouse=LakehouseCacheConfig(root=root / "cache"),
    ...     evidence_dir=root / "evidence",
    ... )
    >>> with QueryService(config) as service:
    ...     diagnostics = service.execute(Scan(str(root / "edges.parquet"))).diagnostics
    >>> diagnostics.rows, diagnostics.lakehouse["objects"], diagnostics.attempts[0].outcome
    (4, 1, 'ok')
    >>> sorted(diagnostics.to_dict())[:3]
    ['algorithm', 'attempts', 'device_id']
    >>> tmp.cleanup()
    """

    query_id: str
    query: dict[str, Any]
    device_id: int
    attempts: tuple[AttemptRecord, ...]
    lakehouse: dict[str, Any]
    source_cache: dict[str, Any]
    graph_cache: dict[str, Any]
    timings: dict[str, float]
    rows: int
    result_fingerprint: str
    algorithm: dict[str, Any] = dataclasses.field(default_factory=dict)
    table: dict[str, Any] | None = None

    def to_dict(self, *, fingerprint: bool = True) -> dict[str, Any]:
        """The diagnostics as plain data. ``fingerprint=False``: a result fingerprint
        not computed yet is given as None rather than computed here (the server
        sends it so; its client computes it from the table it received)."""
        if fingerprint or not isinstance(self.__dict__[_FINGERPRINT], _Deferred):
            out = dataclasses.asdict(self)
        else:
            out = {
                f.name: copy.deepcopy(getattr(self, f.name))
                for f in dataclasses.fields(self)
                if f.name != "result_fingerprint"
            }
            out["result_fingerprint"] = None
        out["attempts"] = [a.to_dict() for a in self.attempts]
        return out

    def __getstate__(self) -> dict[str, Any]:
        # a pickled copy carries the digest, not the result table it is computed from
        state = dict(self.__dict__)
        state[_FINGERPRINT] = self.result_fingerprint
        return state

    def __repr__(self) -> str:
        # never raises: a device result's fingerprint that can no longer be computed
        # (released before it was read) is shown as such
        parts = []
        for f in dataclasses.fields(self):
            try:
                value = getattr(self, f.name)
            except LifecycleError:
                value = _Unreadable()
            parts.append(f"{f.name}={value!r}")
        return f"{type(self).__qualname__}({', '.join(parts)})"

    def __copy__(self) -> Diagnostics:
        # shares a fingerprint not computed yet (computed once, for both), so a copy
        # neither hashes the result nor fails where its device result was released
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> Diagnostics:
        new = object.__new__(type(self))
        for name, value in self.__dict__.items():
            shared = isinstance(value, _Deferred)
            new.__dict__[name] = value if shared else copy.deepcopy(value, memo)
        return new


class _Unreadable:
    def __repr__(self) -> str:
        return "<released before it was read>"


_FINGERPRINT = "_result_fingerprint"
_DIGEST = "_evidence_digest"


class _Deferred:
    """A digest computed once, when first asked for, by ``compute``; it drops
    ``compute`` (and what it holds) once it has the digest (an error of
    ``compute`` propagates, and the next read tries again). Thread-safe."""

    def __init__(self, compute: Callable[[], str]) -> None:
        self._compute: Callable[[], str] | None = compute
        self._digest = ""
        self._lock = threading.Lock()

    def __call__(self) -> str:
        with self._lock:
            if self._compute is not None:
                self._digest = self._compute()
                self._compute = None
            return self._digest


def _deferrable(cls: type, name: str, slot: str) -> None:
    """Make ``cls``'s ``str`` field ``name`` (stored as ``slot``) take a
    :class:`_Deferred`, resolved and kept when first read. The field stays a
    plain field of the dataclass (its __init__, fields(), asdict(), eq and
    repr); set after the decorator, which must not see a class attribute there."""

    def get(self: Any) -> str:
        value = self.__dict__[slot]
        if isinstance(value, _Deferred):
            value = value()
            self.__dict__[slot] = value
        return str(value)

    def put(self: Any, value: str) -> None:
        # the dataclass's __init__ stores the field through this (object.__setattr__)
        self.__dict__[slot] = value

    setattr(cls, name, property(get, put))


_deferrable(Diagnostics, "result_fingerprint", _FINGERPRINT)
_deferrable(AttemptRecord, "evidence_digest", _DIGEST)


def _fingerprint_of(table: Callable[[], pa.Table]) -> Callable[[], str]:
    def compute() -> str:
        from nexus_cache.service.fingerprint import table_fingerprint

        return table_fingerprint(table())

    return compute


def defer_evidence_digest(record: AttemptRecord, digest: Callable[[], str]) -> None:
    """Make ``record.evidence_digest`` what ``digest()`` returns, computed when first
    read and then kept (thread-safe: concurrent first reads compute it once)."""
    object.__setattr__(record, "evidence_digest", _Deferred(digest))


def defer_fingerprint(diagnostics: Diagnostics, table: pa.Table) -> None:
    """Make ``diagnostics.result_fingerprint`` the fingerprint of ``table``, computed
    when first read and then kept (the service's, where it writes no evidence; a
    client's, for the table it received where the server sent none).

    Until it is read, ``diagnostics`` holds ``table``; after, only the digest.
    Thread-safe: concurrent first reads compute it once.

    Parameters
    ----------
    diagnostics : Diagnostics
        The diagnostics whose fingerprint to defer.
    table : pyarrow.Table
        The result the fingerprint is of.

    Examples
    --------
    >>> import pyarrow as pa
    >>> from nexus_cache.service import table_fingerprint
    >>> from nexus_cache.service.result import Diagnostics, defer_fingerprint
    >>> table = pa.table({"x": [1, 2, 3]})
    >>> d = Diagnostics("q", {}, 0, (), {}, {}, {}, {}, 3, "")
    >>> defer_fingerprint(d, table)
    >>> d.result_fingerprint == table_fingerprint(table)
    True
    """
    deferred = _Deferred(_fingerprint_of(lambda: table))
    object.__setattr__(diagnostics, "result_fingerprint", deferred)


def defer_device_fingerprint(diagnostics: Diagnostics, frame: DeviceFrame) -> None:
    """Make ``diagnostics.result_fingerprint`` the fingerprint of the device result
    ``frame``, computed from a host copy of it when first read and then kept. Read
    after ``frame`` was released (and never before), it raises
    :class:`LifecycleError` naming the fix.

    Parameters
    ----------
    diagnostics : Diagnostics
        The diagnostics whose fingerprint to defer.
    frame : DeviceFrame
        The result the fingerprint is of (a device result's frame).

    Examples
    --------
    >>> import pyarrow as pa
    >>> from nexus_cache.backends import HostBackend
    >>> from nexus_cache.frames import DeviceFrame
    >>> from nexus_cache.service import table_fingerprint
    >>> domain = HostBackend(device_total_bytes=1 << 20).create_domain(0)
    >>> table = pa.table({"x": [1, 2, 3]})
    >>> frame = DeviceFrame.from_arrow(table, domain=domain)
    >>> d = Diagnostics("q", {}, 0, (), {}, {}, {}, {}, 3, "")
    >>> defer_device_fingerprint(d, frame)
    >>> d.result_fingerprint == table_fingerprint(table)
    True
    >>> frame.release()
    """
    query_id = diagnostics.query_id

    def host() -> pa.Table:
        if frame.released:
            raise LifecycleError(
                f"the device result of query {query_id} was released before its "
                "result_fingerprint was read; read diagnostics.result_fingerprint before "
                "release(), or set evidence_dir (NEXUS_SERVICE_EVIDENCE_DIR) so the service "
                "records it before execute_on_device returns"
            )
        return frame.to_arrow()

    object.__setattr__(diagnostics, "result_fingerprint", _Deferred(_fingerprint_of(host)))


@dataclasses.dataclass(frozen=True)
class QueryResult:
    """The result table and how it was produced.

    Parameters
    ----------
    table : pyarrow.Table
        The query's result.
    diagnostics : Diagnostics
        How it ran.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import pyarrow as pa, pyarrow.parquet as pq
    >>> from nexus_cache.lakehouse import LakehouseCacheConfig
    >>> from nexus_cache.service import QueryService, Scan, ServiceConfig
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = pathlib.Path(tmp.name)
    >>> edges = pa.table({"src": [1, 2, 3, 3], "dst": [2, 3, 1, 4]})
    >>> pq.write_table(edges, root / "edges.parquet")
    >>> config = ServiceConfig(
    ...     backend="host",
    ...     lakehouse=LakehouseCacheConfig(root=root / "cache"),
    ...     evidence_dir=root / "evidence",
    ... )
    >>> from nexus_cache.service import GraphQuery
    >>> scan = Scan(str(root / "edges.parquet"))
    >>> with QueryService(config) as service:
    ...     result = service.execute(GraphQuery(scan, "src", "dst", "bfs", params={"source": 1}))
    >>> result.table.to_pydict()
    {'vertex': [1, 2, 3, 4], 'distance': [0, 1, 2, 3], 'predecessor': [None, 1, 2, 3]}
    >>> result.diagnostics.algorithm
    {'levels': 4}
    >>> tmp.cleanup()
    """

    table: pa.Table
    diagnostics: Diagnostics


# Relative tolerance per floating type, scaled by the column's largest magnitude.
_FLOAT_RTOL = {np.dtype(np.float16): 1e-2, np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-9}


def tables_match(a: pa.Table, b: pa.Table) -> bool:
    """True when two results are the same answer.

    Schemas, row counts, nulls and every non-floating column must be identical.
    Floating columns may differ in their last bits: GPU reductions (cuSPARSE,
    CUB, atomics) do not fix the order in which they add, so two runs of one
    PageRank on one graph can differ by a few ulps. They must agree within a
    relative tolerance of the column's largest magnitude (float32: 1e-4,
    float64: 1e-9). On the host backend results are bit-identical anyway.

    Parameters
    ----------
    a, b : pyarrow.Table
        The two results.

    Returns
    -------
    bool
        Whether they are the same answer.

    Examples
    --------
    >>> import pyarrow as pa
    >>> from nexus_cache.service import tables_match
    >>> cold = pa.table({"vertex": [1, 2], "pagerank": pa.array([0.5, 0.5], pa.float32())})
    >>> warm = pa.table({"vertex": [1, 2], "pagerank": pa.array([0.50001, 0.49999], pa.float32())})
    >>> tables_match(cold, warm)
    True
    >>> tables_match(cold, pa.table({"vertex": [1, 3], "pagerank": cold["pagerank"]}))
    False
    """
    if a.schema != b.schema or a.num_rows != b.num_rows:
        return False
    for left, right in zip(a.columns, b.columns, strict=True):
        if not pa.types.is_floating(left.type):
            if not left.equals(right):
                return False
            continue
        if left.null_count != right.null_count:
            return False
        x = left.to_numpy(zero_copy_only=False)
        y = right.to_numpy(zero_copy_only=False)
        if not np.array_equal(np.isnan(x), np.isnan(y)):
            return False
        finite = ~np.isnan(x)
        x, y = x[finite], y[finite]
        if x.size == 0:
            continue
        scale = float(np.max(np.abs(x))) or 1.0
        if not np.allclose(x, y, rtol=0.0, atol=_FLOAT_RTOL[x.dtype] * scale):
            return False
    return True
