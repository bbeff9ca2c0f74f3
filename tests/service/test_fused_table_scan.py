"""A table scan on a device domain takes the fused filter where it can: the scan's
residual filters (partition predicates decided per file) and its output columns
go to ``frames.fused_filter``, its kernels here their NumPy ports
(``tests/frames/_fused_port.py``) on the emulated device; the result and the
count equal the host backend's."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from tests.frames import _fused_port
from tests.service._helpers import write_year_month_hive

from nexus_cache.backends import HostBackend
from nexus_cache.frames import DeviceFrame
from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig
from nexus_cache.service import Scan
from nexus_cache.service._table_filter import count_table, scan_table
from nexus_cache.service._table_scan import decode_table_object, plan_table

_fused = importlib.import_module("nexus_cache.frames.fused_filter")


def _rows(n: int) -> pa.Table:
    rng = np.random.default_rng(n)
    size = 500 + 37 * n
    return pa.table(
        {
            "src": pa.array(rng.integers(0, 100, size), pa.int64()),
            "w": pa.array(
                [None if i % 7 == 0 else float(v) for i, v in enumerate(rng.random(size))]
            ),
            "ok": pa.array(rng.random(size) < 0.5),
        }
    )


@pytest.mark.parametrize(
    "flt",
    [
        [("year", "=", 2025), ("w", "<", 0.5)],
        [[("month", "=", 1), ("src", "<", 30)], [("ok", "=", True), ("w", "in", [None])]],
        [("w", "not in", [0.5, None]), ("src", "!=", 7), ("month", "<=", 2)],
        [("src", ">", 1000)],
    ],
)
def test_a_device_scan_and_count_take_the_fused_filter(
    tmp_path: Path, flt: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write_year_month_hive(tmp_path / "t", _rows, 200)
    host = HostBackend(device_total_bytes=1 << 28).create_domain(0)
    config = LakehouseCacheConfig(root=tmp_path / "cache", local_min_age_s=0.0)
    with LakehouseCache(config) as cache:
        plan = plan_table(cache, Scan(str(root), ["src", "w", "ok", "month"], filter=flt))
        read = plan.table
        assert read is not None
        frames: list[DeviceFrame] = [
            decode_table_object(cache, p, f, read, host, [])
            for p, f in zip(plan.plans, read.files, strict=True)
        ]
    built = scan_table(frames, read, host)
    assert built is not None
    want, counts = built
    kernels = _fused_port.PortKernels()
    monkeypatch.setattr(_fused, "_CUDA", kernels)
    domain = _fused_port.Domain()
    for on_device in (False, True):
        got = scan_table(frames, read, domain, on_device=on_device)
        assert got is not None
        table = got[0].to_arrow() if isinstance(got[0], DeviceFrame) else got[0]
        assert table.equals(want)
        assert got[1] == counts
    assert kernels.launches["fused_filter_count"] == kernels.launches["fused_offsets"] == 2
    assert kernels.launches["fused_gather"] == (2 if want.num_rows else 0)
    assert count_table(frames, read, domain) == counts
    assert kernels.launches["fused_filter_count"] == 3
