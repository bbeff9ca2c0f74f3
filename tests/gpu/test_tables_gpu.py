"""Filtered table scans on the CUDA backend: the mask and gather run on CuPy.

Run on the GPU machine (CuPy, one GPU); skipped elsewhere by tests/conftest.py.
The same filters as the host backend, compared row for row (without regard
to row order), and a second filter over the same columns is a source hit.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.tables._compare import assert_same_rows

from nexus_cache.backends import HostBackend
from nexus_cache.lakehouse import LakehouseCacheConfig
from nexus_cache.service import QueryService, Scan, ServiceConfig

pytestmark = pytest.mark.gpu


def _config(root: Path, backend: str) -> ServiceConfig:
    return ServiceConfig(
        backend=backend,
        cache_cap_bytes=1 << 30,
        evidence_dir=root / "evidence",
        lakehouse=LakehouseCacheConfig(
            root=root / "cache", policy="fill_before_read", max_bytes="4GiB", local_min_age_s=0.0
        ),
    )


def _hive(root: Path) -> Path:
    rng = np.random.default_rng(7)
    for year in (2024, 2025):
        for month in (1, 2):
            part = root / "t" / f"year={year}" / f"month={month}"
            part.mkdir(parents=True)
            n = 20_000
            table = pa.table(
                {
                    "src": pa.array(rng.integers(0, 1000, n), pa.int64()),
                    "w": pa.array(
                        [None if i % 11 == 0 else float(v) for i, v in enumerate(rng.random(n))]
                    ),
                    "kind": pa.array(rng.choice(["follow", "like", "b"], n).tolist()),
                }
            )
            pq.write_table(table, part / "part-0.parquet", row_group_size=5000)
    past = time.time() - 60
    for path in (root / "t").rglob("*.parquet"):
        os.utime(path, (past, past))
    return root / "t"


FILTERS: list[Any] = [
    [("year", ">=", 2024), ("w", "<", 0.5)],
    [("kind", "in", ["like", "b"]), ("month", "<=", 2)],
    [[("w", ">=", 0.9)], [("kind", "!=", "follow"), ("src", "<", 100)]],
]


def test_filtered_scans_on_cuda_equal_the_host(tmp_path: Path) -> None:
    table = _hive(tmp_path)
    with (
        QueryService(_config(tmp_path / "gpu", "cuda")) as gpu,
        QueryService(
            _config(tmp_path / "host", "host"), backend=HostBackend(device_total_bytes=2 << 30)
        ) as host,
    ):
        statuses = []
        for flt in FILTERS:
            scan = Scan(str(table), ["src", "w", "kind", "year", "month"], filter=flt)
            got, want = gpu.execute(scan), host.execute(scan)
            assert_same_rows(got.table, want.table)
            assert got.diagnostics.table["rows_after_filter"] == want.table.num_rows
            assert 0 < want.table.num_rows < 80_000
            statuses.append(got.diagnostics.source_cache["status"])
    assert statuses[1:] == ["hit", "hit"]  # one decoded source, many filters


def test_numeric_filtered_scans_and_counts_on_cuda_equal_the_host(tmp_path: Path) -> None:
    """Fixed-width output columns: each object's kept rows gathered on the device into
    one buffer for the whole result, copied to the host in one transfer; a filtered
    count counts the masks. Equal to the host backend's; the work domain holds
    nothing afterwards."""
    from nexus_cache.service import Count

    table = _hive(tmp_path)
    columns = ["src", "w", "year", "month"]
    with (
        QueryService(_config(tmp_path / "gpu", "cuda")) as gpu,
        QueryService(
            _config(tmp_path / "host", "host"), backend=HostBackend(device_total_bytes=2 << 30)
        ) as host,
    ):
        gpu.execute(Scan(str(table), columns))  # whole objects in the source cache
        for flt in [*FILTERS[:1], [("w", ">", 2.0)], [("src", "<", 500), ("w", ">=", 0.25)]]:
            scan = Scan(str(table), columns, filter=flt)
            got, want = gpu.execute(scan), host.execute(scan)
            assert got.diagnostics.source_cache["status"] == "hit"
            assert_same_rows(got.table, want.table)
            assert all(c.num_chunks == 1 for c in got.table.columns)
            counted = gpu.execute(Count(str(table), filter=flt))
            assert counted.table["rows"].to_pylist() == [want.table.num_rows]
        assert gpu._work[0].used_bytes() == 0


def test_device_results_on_cuda_are_cupy_arrays_equal_to_execute(tmp_path: Path) -> None:
    """``execute_on_device`` on CUDA: the result's columns are CuPy arrays in device
    memory of the service's working domain, equal to ``execute``'s table and to the
    host backend's; the fingerprint equals ``execute``'s; the grant stays booked
    until release and the working domain holds nothing afterwards."""
    import cupy

    table = _hive(tmp_path)
    with (
        QueryService(_config(tmp_path / "gpu", "cuda")) as gpu,
        QueryService(
            _config(tmp_path / "host", "host"), backend=HostBackend(device_total_bytes=2 << 30)
        ) as host,
    ):
        for columns in (["src", "w", "year", "month"], ["src", "kind", "month"]):
            gpu.execute(Scan(str(table), columns))  # whole objects in the source cache
            for flt in [*FILTERS[:1], [("src", "<", 500), ("w", ">=", 0.25)]]:
                scan = Scan(str(table), columns, filter=flt)
                want = gpu.execute(scan)
                with gpu.execute_on_device(scan) as result:
                    assert result.diagnostics.source_cache["status"] == "hit"
                    frame = result.frame
                    assert frame.domain is gpu._work[0]
                    assert all(
                        isinstance(c.data, cupy.ndarray) and c.data.device.id == 0
                        for c in frame.columns
                    )
                    snap = gpu.caches.ledger(0).snapshot()
                    assert snap.grant_count == 1
                    assert gpu._work[0].used_bytes() >= frame.nbytes
                    got = result.to_arrow()
                    fingerprint = result.diagnostics.result_fingerprint
                assert got.equals(want.table)
                assert fingerprint == want.diagnostics.result_fingerprint
                assert_same_rows(got, host.execute(scan).table)
                assert gpu.caches.ledger(0).snapshot().grant_count == 0
        assert gpu._work[0].used_bytes() == 0


def _dataset(root: Path, flt: Any, columns: list[str]) -> pa.Table:
    import pyarrow.dataset as ds

    dataset = ds.dataset(str(root), format="parquet", partitioning="hive")
    return dataset.to_table(filter=pq.filters_to_expression(flt), columns=columns)


#: several objects each: one that keeps no row, objects kept whole, nulls
DEVICE_FILTERS: list[Any] = [
    [("w", "<", 0.5), ("src", ">=", 100)],
    [[("year", "=", 2024), ("w", "<", 0.3)], [("year", "=", 2025), ("w", ">", 2.0)]],
    [[("month", "=", 1)], [("w", "<", 0.5)]],
    [("w", "not in", [0.5, None]), ("src", "!=", 7)],
    [("src", ">", 5000)],
]


def test_warm_filtered_scans_on_cuda_equal_pyarrow_dataset(tmp_path: Path) -> None:
    """Warm filtered scans over several objects (one keeping no row, objects kept
    whole, nulls): host and device results equal pyarrow.dataset's rows (and each
    other, in order); a filtered count counts them; nothing is left in the work
    domain."""
    from nexus_cache.service import Count

    table = _hive(tmp_path)
    columns = ["src", "w", "year", "month"]
    with QueryService(_config(tmp_path / "gpu", "cuda")) as gpu:
        gpu.execute(Scan(str(table), columns))  # whole objects in the source cache
        work = gpu._work[0]
        for flt in DEVICE_FILTERS:
            scan = Scan(str(table), columns, filter=flt)
            want = _dataset(table, flt, columns)
            got = gpu.execute(scan)
            assert got.diagnostics.source_cache["status"] == "hit"
            assert_same_rows(got.table, want)
            with gpu.execute_on_device(scan) as result:
                on_device = result.to_arrow()
            assert on_device.equals(got.table)
            counted = gpu.execute(Count(str(table), filter=flt))
            assert counted.table["rows"].to_pylist() == [want.num_rows]
        assert work.used_bytes() == 0


class _CountedKernels:
    """The fused filter's CUDA kernels, each launch counted."""

    def __init__(self, kernels: Any) -> None:
        import collections

        self.kernels = kernels
        self.launches: collections.Counter[str] = collections.Counter()

    def address(self, array: Any) -> int:
        return int(self.kernels.address(array))

    def launch(self, name: str) -> Any:
        function = self.kernels.launch(name)

        def run(grid: Any, block: Any, args: Any) -> None:
            self.launches[name] += 1
            function(grid, block, args)

        return run


def test_the_fused_filter_on_cuda_equals_the_host_in_three_launches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Warm numeric filtered scans (several objects, nulls, one keeping no row) take the
    fused filter on CUDA: one launch of each kernel a query (no gather when nothing is
    kept), one for a count (the one wait is checked on CI, through the kernels'
    ports); the results equal the host backend's."""
    import importlib

    from nexus_cache.service import Count

    fused = importlib.import_module("nexus_cache.frames.fused_filter")
    counted = _CountedKernels(fused._CUDA)
    monkeypatch.setattr(fused, "_CUDA", counted)
    table = _hive(tmp_path)
    columns = ["src", "w", "year", "month"]
    with (
        QueryService(_config(tmp_path / "gpu", "cuda")) as gpu,
        QueryService(
            _config(tmp_path / "host", "host"), backend=HostBackend(device_total_bytes=2 << 30)
        ) as host,
    ):
        gpu.execute(Scan(str(table), columns))  # whole objects in the source cache
        for flt in DEVICE_FILTERS:
            scan = Scan(str(table), columns, filter=flt)
            want = host.execute(scan).table
            counted.launches.clear()
            got = gpu.execute(scan)
            assert_same_rows(got.table, want)
            kept = 1 if want.num_rows else 0
            assert dict(counted.launches) == {
                "fused_filter_count": 1,
                "fused_offsets": 1,
                **({"fused_gather": 1} if kept else {}),
            }
            with gpu.execute_on_device(scan) as result:
                on_device = result.to_arrow()
            assert on_device.equals(got.table)
            counted.launches.clear()
            counts = gpu.execute(Count(str(table), filter=flt))
            assert counts.table["rows"].to_pylist() == [want.num_rows]
            # a count the footers answer (every row group pruned, or a filter pruning
            # decides alone) decodes nothing and launches nothing
            footers = counts.diagnostics.source_cache["status"] == "bypass"
            assert dict(counted.launches) == ({} if footers else {"fused_filter_count": 1})
        assert gpu._work[0].used_bytes() == 0


def test_random_fused_filters_on_cuda_equal_filter_mask_and_gather_table() -> None:
    """The CI comparison of tests/frames/test_fused_filter.py with the real kernels:
    random filters over every type, nullable or not, many objects, small chunks."""
    import importlib

    import cupy
    from tests.frames import test_fused_filter as ci

    from nexus_cache.backends.cuda import CudaBackend
    from nexus_cache.frames import DeviceFrame
    from nexus_cache.tables import canonical_filter

    fused = importlib.import_module("nexus_cache.frames.fused_filter")
    domain = CudaBackend().create_domain(0)
    for seed in range(6):
        for nulls in (False, True):
            rng = np.random.default_rng(seed)
            sizes = [int(rng.choice([0, 1, 63, 64, 65, 3000])) for _ in range(5)]
            frames = ci._frames(seed, sizes, nulls)
            on_gpu = [DeviceFrame.from_arrow(f.to_arrow(), domain=domain) for f in frames]
            output = ["int64", "float32", "bool", "uint8", "ts"]
            sample = frames[int(np.argmax(sizes))].to_arrow()
            for _ in range(8):
                flt = canonical_filter(ci._random_filter(rng, sample), frames[0].schema)
                filters = [None if rng.random() < 0.15 else flt for _ in frames]
                want = ci._reference(frames, filters, output)
                for chunk_rows in (64, fused.CHUNK_ROWS):
                    with domain.scope():
                        got = fused._fused_scan(
                            on_gpu, filters, output, domain, False, fused._CUDA, chunk_rows
                        )
                        device = fused._fused_scan(
                            on_gpu, filters, output, domain, True, fused._CUDA, chunk_rows
                        )
                        count = fused._fused_count(
                            on_gpu, filters, domain, fused._CUDA, chunk_rows
                        )
                    assert ci._identical(got, want), flt.key
                    assert isinstance(device.columns[0].data, cupy.ndarray)
                    assert ci._identical(device.to_arrow(), want), flt.key
                    device.release()
                    assert count == want.num_rows
            for frame in on_gpu:
                frame.release()
    assert domain.used_bytes() == 0
