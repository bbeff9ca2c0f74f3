"""Warm-up: make every kernel a query needs ready before the first query.

On CUDA the first run of each code path compiles GPU kernels: CuPy's own
(elementwise, reductions, sorts, sparse products; kept in memory and in
CuPy's kernel cache on disk) and the package's (the BFS pull step and the
pair intersections, the filtered scans' row compaction and fused filter, and the Parquet
page-decode kernels when ``NEXUS_DECODE_ENGINE`` is ``gpu`` or ``auto``,
through the program cache). On a fresh machine that
costs seconds per query. :func:`warm_up_devices` pays it up front: on each
device it loads the package's kernels for every index type, then runs the
query paths once on a tiny built-in table: the Parquet decode and the scan's
Arrow result, the copy a source-cache hit makes, and every registered graph
algorithm (:data:`nexus_cache.graph.registry.ALGORITHMS`) directed and
undirected, weighted, with dense and with sparse vertex ids, int64 and int32
columns (see :func:`_graph_runs`), each result copied as a cached run hands
it out of the cache's memory (:meth:`GraphResult.copy`) and made Arrow.

On CUDA it then runs every algorithm once more on an R-MAT graph of about a
million edges (:func:`_warm_large`), for CuPy's launch shapes of real sizes.
A vertex an algorithm needs (BFS's source) is always taken from the edge
table at hand: the source of its first edge.

Nothing of it is cached or charged: the table never passes through the
lakehouse, the source or the graph cache, no ledger grant is taken, and what
it allocates lives in the work domain the caller lends and is freed before
it returns. A step that fails frees its arrays before the exception leaves
(the frames of the failed step, which its traceback would keep alive, are
cleared), so the caller finds the domain as it lent it and may close it.
On the host backend the same paths run on NumPy (no compile), in
milliseconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache._tracebacks import drop_frame_locals
from nexus_cache.backends import AllocationDomain, DeviceBackend
from nexus_cache.device import plan_graph_run, run_graph
from nexus_cache.frames import DeviceFrame, decode_parquet, preload_decode_kernels
from nexus_cache.frames.compact import kept_rows
from nexus_cache.frames.fused_filter import fused_count, fused_scan, preload_fused_kernels
from nexus_cache.graph import KernelLoad, preload_kernels
from nexus_cache.graph.registry import ALGORITHMS, AlgorithmSpec
from nexus_cache.service._graph_port import algorithm_params, edge_input, graph_options
from nexus_cache.service.datagen import rmat_edges
from nexus_cache.service.queries import GraphQuery, Scan

__all__ = ["DeviceWarmUp", "WarmUpReport", "warm_up_devices"]

#: lends the work domain of a device for the duration of the block
WorkScope = Callable[[int], contextlib.AbstractContextManager[AllocationDomain]]

# A path from vertex 0 to a hub (2) with many leaves: an undirected BFS from 0
# expands top-down twice, then the hub's arcs make it switch to bottom-up,
# so both BFS steps run. A triangle among the leaves gives the similarities
# common neighbours; a duplicate edge and a self loop go through the
# build's merge and loop handling; the leaves have no out-arcs (dangling
# vertices for PageRank).
_LEAVES = 40
_SPARSE_STRIDE = 1_000_000_007  # ids far apart: renumbering by sort, not by table


@dataclasses.dataclass(frozen=True)
class DeviceWarmUp:
    """What the warm-up ran on one device and how long it took.

    Parameters
    ----------
    device_id : int
        The device.
    seconds : float
        How long its warm-up took.
    steps : tuple of str
        The query paths it ran (decode, each algorithm and graph shape).
    kernels : tuple of KernelLoad
        The kernels it compiled or loaded (none on the host backend).

    Examples
    --------
    >>> from nexus_cache.service import DeviceWarmUp
    >>> DeviceWarmUp(0, 0.5, ("decode", "pagerank (directed)"), ()).to_dict()
    {'device_id': 0, 'seconds': 0.5, 'steps': ['decode', 'pagerank (directed)'], 'kernels': []}
    """

    device_id: int
    seconds: float
    steps: tuple[str, ...]
    kernels: tuple[KernelLoad, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "device_id": self.device_id,
            "seconds": self.seconds,
            "steps": list(self.steps),
            "kernels": [k.to_dict() for k in self.kernels],
        }


@dataclasses.dataclass(frozen=True)
class WarmUpReport:
    """A whole warm-up: the backend, the seconds it took, each device's part.

    :meth:`QueryService.warm_up_report` runs a warm-up and returns one.

    Parameters
    ----------
    backend : str
        The backend's name (``host``, ``cuda``).
    seconds : float
        How long the whole warm-up took.
    devices : tuple of DeviceWarmUp
        Each device's part.

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
    ...     report = service.warm_up_report()
    >>> report.backend, [d.device_id for d in report.devices]
    ('host', [0])
    >>> "decode" in report.devices[0].steps
    True
    >>> tmp.cleanup()
    """

    backend: str
    seconds: float
    devices: tuple[DeviceWarmUp, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "seconds": self.seconds,
            "devices": [d.to_dict() for d in self.devices],
        }


@functools.cache
def _table() -> pa.Table:
    """The built-in table: edges and every kind of column a frame holds."""
    src = [0, 1] + [2] * _LEAVES + [3, 4, 3, 3, 6]
    dst = [1, 2, *range(3, 3 + _LEAVES), 4, 5, 5, 4, 6]
    n = len(src)
    return pa.table(
        {
            "src": pa.array(src, pa.int64()),
            "dst": pa.array(dst, pa.int64()),
            "sparse_src": pa.array([v * _SPARSE_STRIDE for v in src], pa.int64()),
            "sparse_dst": pa.array([v * _SPARSE_STRIDE for v in dst], pa.int64()),
            "src32": pa.array(src, pa.int32()),
            "dst32": pa.array(dst, pa.int32()),
            "weight": pa.array(np.linspace(0.5, 2.0, n), pa.float64()),
            "maybe": pa.array([None if i % 3 == 0 else i for i in range(n)], pa.int64()),
            "flag": pa.array([i % 2 == 0 for i in range(n)], pa.bool_()),
            "label": pa.array([f"v{i % 5}" for i in range(n)], pa.string()),
            "region": pa.array([f"r{i % 3}" for i in range(n)]).dictionary_encode(),
            "when": pa.array(np.arange(n, dtype=np.int64), pa.int64()).cast(pa.timestamp("ms")),
            "day": pa.array(np.arange(n, dtype=np.int32), pa.int32()).cast(pa.date32()),
        }
    )


@functools.cache
def _parquet() -> bytes:
    """The built-in table as Parquet bytes, in two row groups."""
    table = _table()
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=table.num_rows // 2 + 1)
    return bytes(sink.getvalue())


def _sample_params(spec: AlgorithmSpec, edges: pa.Table, src: str) -> dict[str, Any]:
    """Parameters that run ``spec`` on the graph of ``edges``: a vertex it requires is
    the ``src`` end of the first edge, so it is a vertex of that graph whatever
    the labels are (R-MAT's are a random permutation)."""
    return spec.sample_params(int(edges.column(src)[0].as_py()))


def _graph_runs() -> Iterator[tuple[str, GraphQuery]]:
    """``(step label, query)`` of every graph run the warm-up makes: each registered
    algorithm directed (unless its spec takes undirected graphs only) and
    undirected, and the variants its spec makes relevant:
    weighted when it reads weights, sparse ids when it takes a vertex (the lookup
    of a sparse id), int32 columns when it scores pairs (the intersection's index
    types)."""
    edges = Scan("warm-up")  # never read: the frame comes from the built-in table
    table = _table()
    for directed in (True, False):
        kind = "directed" if directed else "undirected"
        for spec in ALGORITHMS.values():
            if directed and spec.undirected_only:
                continue
            params = _sample_params(spec, table, "src")
            name = spec.name
            yield (
                f"{name} ({kind})",
                GraphQuery(edges, "src", "dst", name, directed=directed, params=params),
            )
            if spec.weighted:
                yield (
                    f"{name} ({kind}, weighted)",
                    GraphQuery(
                        edges, "src", "dst", name, "weight", directed=directed, params=params
                    ),
                )
            if any(p.kind == "vertex" for p in spec.params):
                yield (
                    f"{name} ({kind}, sparse ids)",
                    GraphQuery(
                        edges,
                        "sparse_src",
                        "sparse_dst",
                        name,
                        directed=directed,
                        params=_sample_params(spec, table, "sparse_src"),
                    ),
                )
            if spec.rows == "pair":
                yield (
                    f"{name} ({kind}, int32 columns)",
                    GraphQuery(edges, "src32", "dst32", name, directed=directed, params=params),
                )


def _run_graph(query: GraphQuery, frame: DeviceFrame, xp: Any) -> None:
    names = [n for n in (query.src, query.dst, query.weight) if n is not None]
    edges = edge_input([frame], names, xp)
    plan = plan_graph_run(
        query.algorithm,
        source=None,  # no identity: the run never touches a graph cache
        source_column=query.src,
        destination_column=query.dst,
        weight_column=query.weight,
        options=graph_options(query),
    )
    run = run_graph(None, plan, edges, **algorithm_params(query))
    # a cached run hands its result out of the cache's memory with this copy
    run.result.copy().to_arrow()


# CuPy compiles its reduction and scan kernels per launch shape, chosen from
# the input's size: the tiny table above leaves the shapes of real graphs to
# the first query (6.7 s of a first PageRank at R-MAT scale 20 on an H200).
# One run of each algorithm on a graph of about a million edges compiles them.
_LARGE_SCALE = 16


def _large_scale(backend: DeviceBackend) -> int | None:
    """The R-MAT scale of the large-graph step on ``backend``; None: no such step.

    CUDA only: the host compiles nothing per size. Tests replace this hook to run
    the step's logic on the host backend at a small scale."""
    return _LARGE_SCALE if backend.kind.cuda_kernels else None


def _warm_large(backend: DeviceBackend, domain: AllocationDomain, scale: int) -> tuple[str, ...]:
    """Each registered algorithm once, directed (unless it takes undirected graphs
    only) and undirected, on an R-MAT graph of ``scale``; returns what ran."""
    table = rmat_edges(scale)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    frame = decode_parquet(pa.BufferReader(sink.getvalue()), domain=domain)
    ran = []
    try:
        edges = Scan("warm-up")
        for directed in (True, False):
            for spec in ALGORITHMS.values():
                if directed and spec.undirected_only:
                    continue
                query = GraphQuery(
                    edges,
                    "src",
                    "dst",
                    spec.name,
                    directed=directed,
                    params=_sample_params(spec, table, "src"),
                )
                _run_graph(query, frame, backend.xp)
                ran.append(f"{spec.name} ({'directed' if directed else 'undirected'})")
    finally:
        frame.release()
    return tuple(ran)


def _copy_like_a_hit(frame: DeviceFrame, domain: AllocationDomain) -> None:
    copy = frame.copy_into(domain)
    copy.release()


def _fused_filter_once(frame: DeviceFrame, domain: AllocationDomain) -> None:
    """One fused filtered scan (a device result, released) and count of the table."""
    from nexus_cache.tables import canonical_filter

    flt = canonical_filter(
        [[("src", ">=", 1), ("maybe", "in", [1, 4, None])], [("weight", "<", 1.0)]],
        frame.schema,
    )
    result = fused_scan([frame], [flt], ["src", "weight", "flag", "maybe"], domain, on_device=True)
    if isinstance(result, DeviceFrame):
        result.release()
    fused_count([frame], [flt], domain)


def warm_up_device(
    backend: DeviceBackend, device_id: int, domain: AllocationDomain
) -> DeviceWarmUp:
    """Run every query path once on ``device_id`` with device work in ``domain``.

    Everything allocated is released before this returns, on every exception too.
    """
    try:
        return _warm_up_device(backend, device_id, domain)
    except BaseException as exc:
        # the failed step's graph, edge arrays or half-made copy must not keep
        # their bytes in the domain while the caller holds the error
        drop_frame_locals(exc)
        raise


def _warm_up_device(
    backend: DeviceBackend, device_id: int, domain: AllocationDomain
) -> DeviceWarmUp:
    started = time.perf_counter()
    steps: list[str] = []
    kernels: list[KernelLoad] = []
    with backend.device_scope(device_id), domain.scope():
        if backend.kind.cuda_kernels:
            kernels.extend(preload_kernels())
            steps.append("graph kernels")
            # a filtered scan's kept rows: the compact kernel and CuPy's scan of a mask
            kept_rows([backend.xp.ones(4, dtype=bool)], backend.xp)
            steps.append("filtered rows")
            # the fused filter's kernels (a filtered scan or count of numeric columns)
            kernels.extend(preload_fused_kernels())
            steps.append("fused filter kernels")
            # the page-decode kernels, where the decode engine would use them
            decode_kernels = preload_decode_kernels(domain)
            if decode_kernels is not None:
                kernels.extend(decode_kernels)
                steps.append("decode kernels")
        frame = decode_parquet(pa.BufferReader(_parquet()), domain=domain)
        try:
            steps.append("decode")
            frame.to_arrow()
            steps.append("scan result")
            _copy_like_a_hit(frame, domain)
            steps.append("source copy")
            if backend.kind.cuda_kernels:
                _fused_filter_once(frame, domain)
                steps.append("fused filter")
            for label, query in _graph_runs():
                _run_graph(query, frame, backend.xp)
                steps.append(label)
        finally:
            frame.release()
        scale = _large_scale(backend)
        if scale is not None:
            _warm_large(backend, domain, scale)
            steps.append(f"graph algorithms at scale {scale}")
        # the device work ran (asynchronously on CUDA): its time is counted here
        backend.synchronize(device_id)
    return DeviceWarmUp(device_id, time.perf_counter() - started, tuple(steps), tuple(kernels))


def warm_up_devices(
    backend: DeviceBackend, device_ids: Iterable[int], work: WorkScope
) -> WarmUpReport:
    """Warm up each device in turn, its device work in the domain ``work(device_id)`` lends."""
    started = time.perf_counter()
    done = []
    for device_id in device_ids:
        with work(device_id) as domain:
            done.append(warm_up_device(backend, device_id, domain))
    return WarmUpReport(backend.name, time.perf_counter() - started, tuple(done))
