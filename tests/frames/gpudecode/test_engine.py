"""NEXUS_DECODE_ENGINE, the per-column paths, and the page engine's assembly of
columns from decoded chunks (run on the host with the NumPy reference)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.frames.gpudecode.test_reference import write

from nexus_cache.backends import HostBackend
from nexus_cache.errors import BackendUnavailableError, ConfigError
from nexus_cache.frames import DecodeStats, DeviceFrame, decode_parquet
from nexus_cache.frames._page_engine import (
    PagePlan,
    _column_reason,
    decode_page_columns,
    engine_setting,
)
from nexus_cache.frames.gpudecode import ChunkSpec, Page, decode_chunk
from nexus_cache.frames.gpudecode.device import DeviceChunk


def _domain() -> Any:
    return HostBackend(device_total_bytes=1 << 30).create_domain(0)


def _table(n: int = 500) -> pa.Table:
    rng = np.random.default_rng(5)
    mask = rng.random(n) < 0.2
    return pa.table(
        {
            "i": pa.array(rng.integers(-50, 50, n), pa.int64(), mask=mask),
            "s": pa.array([f"v{i % 17}" * (i % 4) for i in range(n)], mask=mask),
            "b": pa.array(rng.random(n) < 0.5),
            "t": pa.array(rng.integers(0, 10**12, n), pa.timestamp("us")),
        }
    )


def _nvcomp(monkeypatch: pytest.MonkeyPatch, installed: bool) -> None:
    """nvCOMP as if it imported (a stand-in module) or not."""
    from nexus_cache.frames.gpudecode import nvcomp

    monkeypatch.setattr(nvcomp, "nvcomp_module", lambda: object() if installed else None)


def test_engine_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEXUS_DECODE_ENGINE", raising=False)
    _nvcomp(monkeypatch, installed=False)
    assert engine_setting(None)[0] == "host"
    monkeypatch.setenv("NEXUS_DECODE_ENGINE", " Auto ")
    assert engine_setting(None)[0] == "auto"
    assert engine_setting("gpu")[0] == "gpu"
    monkeypatch.setenv("NEXUS_DECODE_ENGINE", "cuda")
    with pytest.raises(ConfigError, match="NEXUS_DECODE_ENGINE='cuda' is not accepted"):
        engine_setting(None)
    with pytest.raises(ConfigError, match="engine='fast' is not accepted; use one of: auto"):
        engine_setting("fast")


def _decode(tmp_path: Path, **kwargs: Any) -> tuple[DeviceFrame, DecodeStats]:
    path = tmp_path / "t.parquet"
    pq.write_table(_table(), path, row_group_size=100)
    stats = DecodeStats()
    return decode_parquet(path, domain=_domain(), stats=stats, **kwargs), stats


def test_host_engine_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEXUS_DECODE_ENGINE", raising=False)
    for installed in (True, False):  # with nvCOMP or without it
        _nvcomp(monkeypatch, installed)
        frame, stats = _decode(tmp_path)
        assert stats.paths == dict.fromkeys("isbt", "host: engine host, the default")
        assert frame.to_arrow().equals(pq.read_table(tmp_path / "t.parquet"))


@pytest.mark.usefixtures("emulated_device")
@pytest.mark.parametrize(
    ("codec", "installed", "auto", "gpu"),
    [
        ("snappy", True, "gpu", "gpu"),  # checked on the device before nvCOMP
        ("lz4", True, "gpu", "gpu"),
        ("none", True, "gpu", "gpu"),
        ("none", False, "gpu", "gpu"),  # nothing to decompress
        ("zstd", True, "host: codec ZSTD is not checked before nvCOMP", "gpu"),
        ("gzip", True, "host: codec GZIP is not checked before nvCOMP", "gpu"),
        (
            "snappy",
            False,
            "host: codec SNAPPY is not decompressed by nvCOMP here",
            "gpu (host decompression)",
        ),
    ],
)
def test_auto_leaves_to_the_host_what_nvcomp_would_read_unchecked(
    codec: str, installed: bool, auto: str, gpu: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``auto`` takes a column to the GPU only where its pages need no
    decompression or are checked on the device before nvCOMP reads them;
    ``gpu`` takes every supported column."""
    from tests.frames.gpudecode import _emulator

    from nexus_cache.frames._page_engine import plan_page_columns

    _nvcomp(monkeypatch, installed)
    raw, pf = _file(_table(), compression=codec, row_group_size=200)
    groups = list(range(pf.metadata.num_row_groups))
    for engine, want in (("auto", auto), ("gpu", gpu)):
        plan = plan_page_columns(
            engine, _emulator.Domain(), pf, raw, groups, pf.schema_arrow, "t.parquet"
        )
        assert set(plan.paths) == set(pf.schema_arrow.names)
        if want.startswith("host"):
            assert plan.gpu == {}
            for path in plan.paths.values():  # the first row group names the reason
                assert path.startswith(want)
                assert path.endswith("in row group 0")
        else:
            assert set(plan.paths.values()) == {want}
            assert set(plan.gpu) == set(pf.schema_arrow.names)


def test_a_host_decode_asks_no_device_for_its_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no column for the GPU there is no heap to size: CuPy is not asked (on a
    machine without it, a failed import on every read)."""
    import importlib

    engine = importlib.import_module("nexus_cache.frames._page_engine")

    def asked() -> int:
        raise AssertionError("the device's free memory was asked for a host decode")

    monkeypatch.setattr(engine, "_free_device_bytes", asked)
    for setting in ("host", "auto"):
        frame, _ = _decode(tmp_path, engine=setting)
        assert frame.to_arrow().equals(pq.read_table(tmp_path / "t.parquet"))


def test_auto_on_a_host_domain_decodes_on_the_host(tmp_path: Path) -> None:
    frame, stats = _decode(tmp_path, engine="auto")
    assert set(stats.paths.values()) == {"host: the domain's memory is host memory"}
    assert frame.to_arrow().equals(pq.read_table(tmp_path / "t.parquet"))


def test_gpu_on_a_host_domain_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEXUS_DECODE_ENGINE", "gpu")
    with pytest.raises(BackendUnavailableError, match="NEXUS_DECODE_ENGINE='gpu' needs a CUDA"):
        _decode(tmp_path)


def _file(table: pa.Table, **options: Any) -> tuple[bytes, pq.ParquetFile]:
    raw = write(table, **options)
    return raw, pq.ParquetFile(io.BytesIO(raw))


@pytest.mark.parametrize(
    ("table", "options", "reason"),
    [
        (_table(), {"compression": "brotli"}, "codec BROTLI in row group 0"),
        (pa.table({"i": [[1], [2]]}), {}, "nested column"),
        (pa.table({"i": pa.array([1], pa.uint32())}), {}, "type uint32 from physical type"),
    ],
)
def test_unsupported_columns_name_their_reason(
    table: pa.Table, options: dict[str, Any], reason: str
) -> None:
    raw, pf = _file(table, **options)
    why, chunks = _column_reason(pf, raw, [0], pf.schema_arrow.field(0), "t.parquet")
    assert why is not None
    assert why.startswith(reason)
    assert chunks == []


def test_a_column_read_as_dictionary_goes_to_the_gpu_unless_it_fell_back() -> None:
    raw, _ = _file(_table())
    pf = pq.ParquetFile(io.BytesIO(raw), read_dictionary=["s"])
    schema = pf.read_row_groups([], columns=["s"]).schema
    why, chunks = _column_reason(pf, raw, [0], schema.field("s"), "t.parquet")
    assert why is None
    assert len(chunks) == 1
    # distinct values past the dictionary page limit: the writer falls back to PLAIN
    many = pa.table({"s": [f"value-{i}" for i in range(5000)]})
    raw, _ = _file(many, dictionary_pagesize_limit=1024)
    pf = pq.ParquetFile(io.BytesIO(raw), read_dictionary=["s"])
    why, _ = _column_reason(pf, raw, [0], pf.schema_arrow.field("s"), "t.parquet")
    assert why is not None
    assert why.startswith("PLAIN data pages (the writer gave up on the dictionary) read as")


def _reference_on(domain: Any) -> Any:
    """A chunk decoder over the NumPy reference, its buffers copied into ``domain``."""

    def decode(data: Any, spec: ChunkSpec, _: Any, pages: list[Page]) -> DeviceChunk:
        piece = decode_chunk(data, spec, pages)
        copy = [None if a is None else domain.copy_in(a) for a in (piece.offsets, piece.validity)]
        return DeviceChunk(piece.length, domain.copy_in(piece.data), *copy)

    return decode


@pytest.mark.parametrize("row_group_size", [100, 1000])
def test_page_columns_are_joined_across_row_groups(row_group_size: int) -> None:
    table = _table()
    raw, pf = _file(table, row_group_size=row_group_size, data_page_size=256)
    groups = list(range(pf.metadata.num_row_groups))
    plan = PagePlan()
    for f in table.schema:
        why, chunks = _column_reason(pf, raw, groups, f, "t.parquet")
        assert why is None
        plan.gpu[f.name] = chunks
    domain = _domain()
    columns = decode_page_columns(plan, table.schema, domain, decode=_reference_on(domain))
    frame = DeviceFrame([columns[n] for n in table.column_names], num_rows=500, domain=domain)
    assert frame.to_arrow().equals(pq.read_table(io.BytesIO(raw)))


@pytest.mark.parametrize("codec", ["snappy", "zstd", "none"])
def test_the_path_says_where_pages_are_decompressed(
    codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nvCOMP importable: the pages are decompressed on the device ("gpu");
    without it, on the host ("gpu (host decompression)"), except that a
    chunk without a codec needs no decompression."""
    import sys

    from nexus_cache.frames._page_engine import _gpu_path
    from nexus_cache.frames.gpudecode import nvcomp

    pytest.importorskip("nvidia.nvcomp")
    raw, pf = _file(_table(), compression=codec)
    field = pf.schema_arrow.field(0)
    why, chunks = _column_reason(pf, raw, [0], field, "t.parquet")
    assert why is None
    nvcomp.nvcomp_module.cache_clear()
    assert _gpu_path(chunks) == "gpu"
    monkeypatch.setitem(sys.modules, "nvidia.nvcomp", None)  # as if not installed
    nvcomp.nvcomp_module.cache_clear()
    try:
        expected = "gpu" if codec == "none" else "gpu (host decompression)"
        assert _gpu_path(chunks) == expected
    finally:
        monkeypatch.undo()
        nvcomp.nvcomp_module.cache_clear()


@pytest.mark.usefixtures("emulated_device")
def test_auto_leaves_to_the_host_a_file_whose_row_group_a_limited_domain_cannot_heap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ``auto`` a decode never needs more device memory than the host
    engine would: a row group whose GPU heap passes an eighth of a limited
    domain sends the file's columns to the host; ``gpu`` still takes them."""
    from tests.frames.gpudecode import _emulator

    from nexus_cache.frames._page_engine import plan_page_columns

    _nvcomp(monkeypatch, installed=True)
    raw, pf = _file(_table(2000), compression="snappy", row_group_size=500)
    groups = list(range(pf.metadata.num_row_groups))
    heap = max(
        sum(
            pf.metadata.row_group(g).column(j).total_compressed_size
            + pf.metadata.row_group(g).column(j).total_uncompressed_size
            for j in range(pf.metadata.num_columns)
        )
        for g in groups
    )
    for limit, want in ((64 * heap, "gpu"), (4 * heap, "host: row group ")):
        domain = _emulator.Domain(limit_bytes=limit)
        plan = plan_page_columns("auto", domain, pf, raw, groups, pf.schema_arrow, "t.parquet")
        assert all(p.startswith(want) for p in plan.paths.values()), plan.paths
        assert bool(plan.gpu) == (want == "gpu")
        if want != "gpu":
            assert "engine gpu takes it" in next(iter(plan.paths.values()))
            forced = plan_page_columns(
                "gpu", domain, pf, raw, groups, pf.schema_arrow, "t.parquet"
            )
            assert set(forced.paths.values()) == {"gpu"}
