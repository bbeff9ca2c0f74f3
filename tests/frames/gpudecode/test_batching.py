"""How the GPU engine feeds the device decoder: row groups batched into heaps
by bytes, each page copied once from the file's bytes through the transfer
(one copy per heap), one nvCOMP codec per algorithm for a whole decode. On the
emulated device."""

from __future__ import annotations

import importlib
import io
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.frames.gpudecode import _emulator
from tests.frames.gpudecode.test_reference import write

from nexus_cache.frames import DeviceFrame
from nexus_cache.frames.gpudecode import nvcomp
from nexus_cache.frames.gpudecode.layout import HeapLayout
from nexus_cache.frames.gpudecode.pages import PageType
from nexus_cache.frames.staging import Transfer

_engine = importlib.import_module("nexus_cache.frames._page_engine")
_device = importlib.import_module("nexus_cache.frames.gpudecode.device")
_heap = importlib.import_module("nexus_cache.frames.gpudecode._heap")


class _Transfer(Transfer):
    """The host transfer, recording each image it copies (its pieces' bytes)."""

    def __init__(self) -> None:
        super().__init__(_emulator.Domain())  # type: ignore[arg-type]
        self.images: list[int] = []

    def pieces_to_device(self, pieces: Any, nbytes: int, dst: Any) -> None:
        self.images.append(sum(memoryview(p).nbytes for _, p in pieces))
        super().pieces_to_device(pieces, nbytes, dst)


def _table(n: int = 4000) -> pa.Table:
    rng = np.random.default_rng(9)
    mask = rng.random(n) < 0.1
    return pa.table(
        {
            "i": pa.array(rng.integers(0, 1 << 40, n), pa.int64(), mask=mask),
            "f": pa.array(rng.random(n), pa.float64()),
            "s": pa.array([f"s{i % 97}" * (i % 3) for i in range(n)], mask=mask),
        }
    )


def _plan(raw: bytes) -> tuple[Any, pa.Schema]:
    pf = pq.ParquetFile(io.BytesIO(raw))
    groups = list(range(pf.metadata.num_row_groups))
    plan = _engine.PagePlan()
    for f in pf.schema_arrow:
        why, chunks = _engine._column_reason(pf, raw, groups, f, "t.parquet")
        assert why is None
        plan.gpu[f.name] = chunks
    return plan, pf.schema_arrow


def _decode(raw: bytes, transfer: Any, calls: list[int], domain: Any = None) -> pa.Table:
    real = _engine.decode_chunks_on_device

    def counted(items: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(items))
        return real(items, *args, **kwargs)

    plan, schema = _plan(raw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_engine, "decode_chunks_on_device", counted)
        columns = _engine.decode_page_columns(
            plan, schema, domain or _emulator.Domain(), transfer=transfer
        )
    arrays = []
    for f in schema:
        c = columns[f.name]
        host = SimpleNamespace(
            field=f,
            length=c.length,
            data=c.data.get(),
            offsets=None if c.offsets is None else c.offsets.get(),
            validity=None if c.validity is None else c.validity.get(),
        )
        arrays.append(host)
    return _to_table(arrays)


def _to_table(columns: list[Any]) -> pa.Table:
    from nexus_cache.backends import HostBackend
    from nexus_cache.frames.column import DeviceColumn

    domain = HostBackend(device_total_bytes=1 << 30).create_domain(0)
    made = [
        DeviceColumn(
            c.field,
            c.length,
            domain.copy_in(np.asarray(c.data)),
            None if c.offsets is None else domain.copy_in(np.asarray(c.offsets)),
            None if c.validity is None else domain.copy_in(np.asarray(c.validity)),
        )
        for c in columns
    ]
    return DeviceFrame(made, num_rows=made[0].length, domain=domain).to_arrow()


@pytest.mark.usefixtures("emulated_device")
@pytest.mark.parametrize(("batch_bytes", "heaps"), [(1 << 30, 1), (1, 8)])
def test_row_groups_are_batched_into_heaps_by_bytes(
    batch_bytes: int, heaps: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = write(_table(), row_group_size=500, compression="snappy")
    monkeypatch.setattr(_engine, "HEAP_BATCH_BYTES", batch_bytes)
    calls: list[int] = []
    got = _decode(raw, None, calls)
    assert got.equals(pq.read_table(io.BytesIO(raw)))
    assert len(calls) == heaps  # 8 row groups: one heap, or one each
    assert sum(calls) == 8 * 3  # every chunk once


@pytest.mark.usefixtures("emulated_device")
def test_a_domain_with_a_limit_takes_an_eighth_of_it_per_heap() -> None:
    raw = write(_table(), row_group_size=500, compression="snappy")
    plan, _ = _plan(raw)
    per_group = sum(
        spec.size + spec.uncompressed_size
        for _, spec, _ in (chunks[0] for chunks in plan.gpu.values())
    )
    calls: list[int] = []
    got = _decode(raw, None, calls, _emulator.Domain(limit_bytes=8 * (2 * per_group + 1)))
    assert got.equals(pq.read_table(io.BytesIO(raw)))
    assert len(calls) >= 4  # about two row groups a heap, not all eight in one


def test_batches_hold_whole_row_groups_up_to_the_bytes() -> None:
    def group(size: int) -> list[Any]:
        spec = SimpleNamespace(size=size, uncompressed_size=size)
        return [(None, spec, []), (None, spec, [])]  # two chunks of 2 * size each

    sizes = [10, 10, 5, 30, 20, 200, 1, 1]
    got = _engine._batches([group(s) for s in sizes], 100)
    # heap bytes per row group: 40, 40, 20 | 120 | 80 | 800 | 4, 4
    assert [len(b) for b in got] == [3, 1, 1, 1, 2]


@pytest.mark.usefixtures("emulated_device")
@pytest.mark.parametrize("batch_bytes", [1 << 30, 1])
@pytest.mark.parametrize("codec", ["snappy", "zstd"])
def test_each_heap_is_one_copy_of_its_pages_through_the_transfer(
    batch_bytes: int, codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = write(_table(), row_group_size=1000, compression=codec, data_page_version="2.0")
    monkeypatch.setattr(_engine, "HEAP_BATCH_BYTES", batch_bytes)
    transfer = _Transfer()
    calls: list[int] = []
    got = _decode(raw, transfer, calls)
    assert got.equals(pq.read_table(io.BytesIO(raw)))
    # one copy per heap (one heap, or one a row group), not one per page
    assert len(calls) == (1 if batch_bytes > 1 else 4)
    assert transfer.stats.h2d_copies == len(transfer.images) == len(calls)
    plan, _ = _plan(raw)
    stored = pages_count = chunk_bytes = 0
    for chunks in plan.gpu.values():
        for _, spec, pages in chunks:
            chunk_bytes += spec.size
            for page in pages:
                h = page.header
                pages_count += 1
                stored += len(page.payload) - (
                    h.rep_bytes if h.type == PageType.DATA_PAGE_V2 else 0
                )
    assert pages_count > 4 * len(calls)
    if codec == "snappy":
        # nvCOMP reads Snappy at any byte: each chunk's own bytes, once, no more
        assert sum(transfer.images) == chunk_bytes
    else:
        # Zstd inputs at 8 bytes: a chunk as its image and the pages it has
        # misaligned copied (at most a quarter of it), or page by page: every
        # page's stored bytes (a v2 page: its levels and values apart)
        assert stored <= sum(transfer.images) <= chunk_bytes * 5 // 4


def test_the_host_image_places_each_piece_with_zeros_between() -> None:
    layout = HeapLayout()
    a = layout._put(b"abc")
    b = layout._put(memoryview(b"0123456789abcdefXY")[2:5])
    assert (a, b) == (0, nvcomp.ALIGNMENT)
    image = layout.host_image()
    assert image.tobytes() == b"abc" + bytes(nvcomp.ALIGNMENT - 3) + b"234"
    assert layout.host_size == nvcomp.ALIGNMENT + 3


def test_a_decode_reuses_one_codec_per_algorithm(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []

    class _Codec:
        def __init__(self, algorithm: str, **_: Any) -> None:
            made.append(algorithm)

        def decode(self, sources: Any, out: Any) -> Any:
            return SimpleNamespace(buffer_sizes=[size for _, size in out])

    fake_nvcomp = SimpleNamespace(
        Codec=_Codec,
        BitstreamKind=SimpleNamespace(RAW="raw"),
        as_arrays=lambda heap, offsets, sizes, cuda_stream: list(zip(offsets, sizes, strict=True)),
    )
    stream = SimpleNamespace(ptr=7)
    fake_cupy = SimpleNamespace(
        cuda=SimpleNamespace(
            get_current_stream=lambda: stream, runtime=SimpleNamespace(getDevice=lambda: 0)
        )
    )
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setattr(nvcomp, "nvcomp_module", lambda: fake_nvcomp)
    jobs = [(0, 4, 16, 8)]
    codecs: dict[Any, Any] = {}
    for algorithm in ("Snappy", "Snappy", "Zstd", "Snappy"):
        nvcomp.decompress_batch(None, algorithm, jobs, "t", codecs)
    assert made == ["Snappy", "Zstd"]
    stream.ptr = 8  # another stream: its own codec
    nvcomp.decompress_batch(None, "Snappy", jobs, "t", codecs)
    nvcomp.decompress_batch(None, "Snappy", jobs, "t")  # no cache: a codec of its own
    assert made == ["Snappy", "Zstd", "Snappy", "Snappy"]


@pytest.mark.usefixtures("emulated_device")
def test_page_tables_go_up_in_one_upload_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every step over a chunk's pages (levels and index expansions, PLAIN
    # booleans, level-length and head gathers) uploads its page table in one
    # copy and makes its device arrays in few allocations, however many pages.
    uploads, allocations = [0], [0]
    real_asarray, real_wrap = _emulator.fake_cupy.asarray, _emulator._wrap

    def asarray(a: Any) -> Any:
        uploads[0] += 1
        return real_asarray(a)

    def wrap(a: Any) -> Any:
        allocations[0] += 1
        return real_wrap(a)

    monkeypatch.setattr(_emulator.fake_cupy, "asarray", asarray)
    monkeypatch.setattr(_emulator, "_wrap", wrap)
    steps: dict[str, list[tuple[int, int]]] = {}
    for name in ("expand", "packed_runs", "gather"):
        real = getattr(_heap._Chunk, name)

        def counted(self: Any, *args: Any, _real: Any = real, _name: str = name) -> Any:
            before = (uploads[0], allocations[0])
            out = _real(self, *args)
            steps.setdefault(_name, []).append(
                (uploads[0] - before[0], allocations[0] - before[1])
            )
            return out

        monkeypatch.setattr(_heap._Chunk, name, counted)
    table = _table(6000).append_column("b", pa.array(np.arange(6000) % 3 == 0))
    raw = write(
        table, row_group_size=3000, compression="snappy", data_page_size=64, write_batch_size=100
    )
    got = _decode(raw, None, [])
    assert got.equals(pq.read_table(io.BytesIO(raw)))
    plan, _ = _plan(raw)
    assert min(len(pages) for chunks in plan.gpu.values() for _, _, pages in chunks) > 4
    assert set(steps) == {"expand", "packed_runs", "gather"}
    # expand: its table (one upload), its runs' scratch, its output
    assert all(u == 1 and a <= 3 for u, a in steps["expand"]), steps["expand"]
    assert all(u == 1 and a <= 2 for u, a in steps["packed_runs"]), steps["packed_runs"]
    # gather: the byte indices (one upload) and the gathered bytes
    assert all(u <= 1 and a <= 2 for u, a in steps["gather"]), steps["gather"]


@pytest.mark.usefixtures("emulated_device")
def test_the_plans_pages_are_checked_once_not_again_by_the_device_decoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # plan_page_columns checks every chunk's pages; the device decoder, handed
    # the plan's pages, does not walk them again (a caller's own pages still are)
    raw = write(_table(), row_group_size=500, compression="snappy")
    walks: list[str] = []
    real = _device.unsupported_reason

    def counted(spec: Any, pages: Any = None) -> Any:
        walks.append(spec.column)
        return real(spec, pages)

    monkeypatch.setattr(_device, "unsupported_reason", counted)
    got = _decode(raw, None, [])
    assert got.equals(pq.read_table(io.BytesIO(raw)))
    assert walks == []
    plan, _ = _plan(raw)
    data, spec, pages = plan.gpu["s"][0]
    _device.decode_chunks_on_device([(data, spec, pages)], _emulator.Domain())
    assert walks == ["s"]
