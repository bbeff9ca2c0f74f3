"""One GPU worker (a Dask worker process on GPU 0) through the cluster suite."""

from __future__ import annotations

import json
import os

import pytest

distributed = pytest.importorskip("distributed")

from nexus_cache.cluster import SHUTDOWN_RECORD, ClusterQueryClient  # noqa: E402
from nexus_cache.service import Count, GraphQuery, QueryService, Scan, tables_match  # noqa: E402
from service._helpers import make_config, make_lake  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

SRC = 'extern "C" __global__ void twice(int *a) { *a *= 2; }\n'


def _compile_on_worker() -> tuple[bytes, int]:
    import cuda.core
    import cupy

    from nexus_cache.cluster import worker_program_cache
    from nexus_cache.program import CompileInputs, cached_compile

    cache = worker_program_cache()
    arch = f"sm_{cupy.cuda.Device(0).compute_capability}"
    inputs = CompileInputs(SRC, "c++", cuda.core.ProgramOptions(arch=arch))
    obj = cached_compile(inputs, "cubin", cache=cache)
    return bytes(obj.code), cache.stats().hits


def test_one_gpu_worker_runs_the_suite(tmp_path, monkeypatch):
    # The worker sees one GPU, as under dask-cuda.
    first_gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", first_gpu)
    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(tmp_path / "programs"))
    monkeypatch.delenv("NEXUS_PROGRAM_CACHE_REDIS_URL", raising=False)
    lake = make_lake(tmp_path)
    evidence = tmp_path / "evidence"
    edges = Scan(lake.edges, columns=("src", "dst"))
    queries = [
        Scan(lake.facts),
        Count(lake.facts),
        GraphQuery(edges, "src", "dst", "pagerank"),
        GraphQuery(edges, "src", "dst", "bfs", params={"source": lake.bfs_source}),
        GraphQuery(edges, "src", "dst", "jaccard", directed=False),
    ]
    cluster = distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0"
    )
    client = distributed.Client(cluster)
    try:
        nexus = ClusterQueryClient(
            client, make_config(tmp_path, backend="cuda", evidence_dir=evidence)
        )
        (worker,) = nexus.workers()
        with QueryService(make_config(tmp_path / "host", backend="host")) as alone:
            for query in queries:
                there = nexus.execute(query)
                assert there.diagnostics.worker == worker
                assert tables_match(there.table, alone.execute(query).table), query
        again = nexus.execute(queries[0])
        assert again.diagnostics.source_cache["status"] == "hit"
        (report,) = nexus.report()
        assert report["devices"][0]["backend"] == "cuda"
        assert report["devices"][0]["source_hits"] >= 1
        # the worker warmed up on its GPU when the plugin started: kernels loaded
        warm_up = report["warm_up"]
        assert warm_up["state"] == "done", warm_up["error"]
        assert warm_up["backend"] == "cuda"
        assert "graph kernels" in warm_up["devices"][0]["steps"]
        first, hits = client.submit(_compile_on_worker, pure=False).result()
        second, hits_after = client.submit(_compile_on_worker, pure=False).result()
        assert first == second
        assert hits_after == hits + 1
    finally:
        client.close()
        cluster.close()
    (record_path,) = evidence.glob(f"worker-*/{SHUTDOWN_RECORD}")
    record = json.loads(record_path.read_text())
    assert record["complete"] is True
    assert record["devices"][0]["domain_released"] is True
