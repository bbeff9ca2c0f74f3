"""The device decoder's host side (heap layout, page tables, page groups, the
values read back) driven on the host: CuPy and the kernels replaced by the
line-for-line ports of ``_emulator`` (the stream checks before nvCOMP
included), nvCOMP by PyArrow's codecs on the same heap slices. Equal to
PyArrow's decode, bit for bit, with device and with host decompression.
(The real kernels and nvCOMP: tests/gpu.)"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from tests.frames.gpudecode import _emulator
from tests.frames.gpudecode._check import assert_same, check_file, device_piece
from tests.frames.gpudecode.test_reference import CODECS, WRITE_OPTIONS, tables, write

from nexus_cache.errors import SourceFormatError
from nexus_cache.frames._host import HostPiece
from nexus_cache.frames.gpudecode import ChunkSpec, Page
from nexus_cache.frames.gpudecode.layout import layout_chunk, level_offsets, page_sections_at
from nexus_cache.frames.gpudecode.nvcomp import CODEC_ALGORITHMS
from nexus_cache.frames.gpudecode.reference import page_sections
from nexus_cache.frames.gpudecode.support import CODECS as PYARROW_CODECS

_heap = importlib.import_module("nexus_cache.frames.gpudecode._heap")
_steps = importlib.import_module("nexus_cache.frames.gpudecode._steps")


def _decode_together(items: list[tuple[bytes, ChunkSpec, list[Page]]]) -> list[HostPiece]:
    """What ``decode_chunks_on_device`` does, on the emulated device."""
    heap = _heap._Heap(_emulator.fake_cupy, items)
    return [
        device_piece(got, spec.arrow_type)
        for (_, spec, _), got in zip(items, _steps.decode_all(heap.chunks), strict=True)
    ]


def _row_group(raw: bytes, g: int = 0) -> list[tuple[bytes, ChunkSpec, list[Page]]]:
    """Every chunk of row group ``g`` of the file ``raw``: its bytes, spec and pages."""
    import io

    import pyarrow.parquet as pq

    from nexus_cache.frames.gpudecode import chunk_spec, read_pages

    pf = pq.ParquetFile(io.BytesIO(raw))
    out = []
    for j in range(pf.metadata.num_columns):
        spec = chunk_spec(pf, g, j, "t.parquet")
        chunk = raw[spec.start : spec.start + spec.size]
        out.append((chunk, spec, read_pages(chunk, spec)))
    return out


def _emulated(device_codec: bool) -> Any:
    def decode(chunk: bytes, spec: ChunkSpec, pages: list[Page]) -> HostPiece:
        return _decode_together([(chunk, spec, pages)])[0]

    return decode


@pytest.fixture(params=[True, False], ids=["device-decompression", "host-decompression"])
def device_codec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setattr(_heap, "kernel_function", _emulator.kernel_function)
    monkeypatch.setattr(_heap, "decompress_batch", _emulator.decompress_like_nvcomp)
    # nvCOMP's algorithm names: the Snappy and LZ4 pages are checked (the
    # emulator's stream-check ports) before they are decompressed
    algorithm = CODEC_ALGORITHMS.get if request.param else (lambda codec: None)
    monkeypatch.setattr(_heap, "device_algorithm", algorithm)
    return bool(request.param)


def _mixed_table(n: int = 3000) -> pa.Table:
    rng = np.random.default_rng(5)
    mask = rng.random(n) < 0.2
    return pa.table(
        {
            "i": pa.array(rng.integers(0, 50, n), pa.int64(), mask=mask),
            # many distinct values: the writer falls back from the dictionary mid-chunk
            "wide": pa.array(rng.integers(0, 1 << 40, n), pa.int64()),
            "f": pa.array(rng.random(n), pa.float32(), mask=mask),
            "b": pa.array(rng.random(n) < 0.3, mask=mask),
            "s": pa.array([f"k{i % 37}" for i in range(n)], mask=mask),
            "u": pa.array([f"u{i}" * (i % 3) for i in range(n)]),
            "d": pa.array(np.arange(n, dtype=np.int32), pa.int32()).cast(pa.date32()),
        }
    )


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_emulated_device_decode_equals_pyarrow(
    device_codec: bool, codec: str, version: str
) -> None:
    raw = write(
        _mixed_table(),
        compression=codec,
        data_page_version=version,
        data_page_size=2048,
        dictionary_pagesize_limit=4096,
    )
    check_file(raw, decode=_emulated(device_codec))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(table=tables(), options=WRITE_OPTIONS)
def test_emulated_device_decode_of_generated_tables(
    device_codec: bool, table: pa.Table, options: dict[str, Any]
) -> None:
    check_file(write(table, **options), decode=_emulated(device_codec))


def _heap_of(layout: Any, spec: ChunkSpec) -> bytes:
    heap = bytearray(layout.size)
    heap[: layout.host_size] = layout.host_image().tobytes()
    for source, size, out, want in [j for jobs in layout.jobs.values() for j in jobs]:
        data = bytes(heap[source : source + size])
        got = pa.decompress(data, want, codec=PYARROW_CODECS[spec.codec], asbytes=True)
        heap[out : out + want] = got
    return bytes(heap)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("version", ["1.0", "2.0"])
@pytest.mark.parametrize("device_decompression", [True, False])
def test_the_heap_holds_each_page_as_the_reference_cuts_it(
    codec: str, version: str, device_decompression: bool
) -> None:
    import io

    import pyarrow.parquet as pq

    from nexus_cache.frames.gpudecode import chunk_spec, read_pages

    table = _mixed_table(500)
    raw = write(table, compression=codec, data_page_version=version, data_page_size=512)
    pf = pq.ParquetFile(io.BytesIO(raw))
    jobs = 0
    for j in range(pf.metadata.num_columns):
        spec = chunk_spec(pf, 0, j, "t.parquet")
        pages = read_pages(raw[spec.start : spec.start + spec.size], spec)
        algorithm = PYARROW_CODECS[spec.codec] if device_decompression else None
        layout = layout_chunk(spec, pages, algorithm)
        jobs += sum(len(j) for j in layout.jobs.values())
        heap = _heap_of(layout, spec)
        (placed,) = layout.chunks
        lengths = [
            int.from_bytes(heap[o : o + 4], "little") for o in level_offsets(placed, spec).tolist()
        ]
        sections = page_sections_at(placed, spec, lengths)
        for page, l0, l1, v0, v1 in zip(pages, *(f.tolist() for f in sections), strict=True):
            assert (heap[l0:l1], heap[v0:v1]) == page_sections(page, spec)
    # (a v2 page that does not shrink is stored uncompressed: no job)
    assert bool(jobs) == (device_decompression and codec != "none")


def _layout_page_by_page(
    items: list[tuple[ChunkSpec, list[Page]]], algorithm: str | None
) -> tuple[list[tuple[int, bytes]], int, int, dict[str, list[Any]], list[list[Any]]]:
    """The heap layout placed one page at a time (the planner the array one
    replaced), as plain values: pieces, host size, size, jobs, and every
    page's (body, body end, levels, levels size)."""
    from nexus_cache.frames.gpudecode.nvcomp import ALIGNMENT
    from nexus_cache.frames.gpudecode.reference import decompress_section

    def up(n: int) -> int:
        return -(-n // ALIGNMENT) * ALIGNMENT

    pieces: list[tuple[int, bytes]] = []
    host = 0

    def put(data: Any) -> int:
        nonlocal host
        at, size = up(host), memoryview(data).nbytes
        if size:
            pieces.append((at, bytes(data)))
        host = at + size
        return at

    places: list[list[Any]] = []
    pending = []
    for spec, pages in items:
        codec = PYARROW_CODECS[spec.codec]
        placed = []
        for page in pages:
            h, section = page.header, page.payload
            size, levels, levels_size, compressed = h.uncompressed_size, 0, 0, codec is not None
            if h.type == 3:
                levels_size = h.def_bytes
                levels = put(section[h.rep_bytes : h.rep_bytes + levels_size])
                section = section[h.rep_bytes + levels_size :]
                size -= h.rep_bytes + levels_size
                compressed = compressed and h.is_compressed
            if compressed and algorithm is not None and size > 0:
                pending.append((placed, len(placed), put(section), len(section), size))
                placed.append([0, 0, levels, levels_size])
                continue
            body = decompress_section(section, size, codec if compressed else None)
            at = put(body)
            placed.append([at, at + len(body), levels, levels_size])
        places.append(placed)
    jobs: dict[str, list[Any]] = {}
    cursor = up(host)
    for placed, i, source, in_size, size in pending:
        assert algorithm is not None
        jobs.setdefault(algorithm, []).append((source, in_size, cursor, size))
        placed[i][:2] = [cursor, cursor + size]
        cursor = up(cursor + size)
    return pieces, host, max(cursor, 1), jobs, places


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("version", ["1.0", "2.0"])
@pytest.mark.parametrize("device_decompression", [True, False])
def test_the_array_layout_places_every_page_as_the_page_by_page_one(
    codec: str, version: str, device_decompression: bool
) -> None:
    # several chunks in one heap (every column of two row groups, v1 and v2
    # pages, dictionary pages, an empty chunk): the same pieces, jobs and
    # places as placing the pages one at a time
    import io

    import pyarrow.parquet as pq

    from nexus_cache.frames.gpudecode import chunk_spec, read_pages
    from nexus_cache.frames.gpudecode.layout import HeapLayout

    table = _mixed_table(700)
    raw = write(
        table, compression=codec, data_page_version=version, data_page_size=512, row_group_size=400
    )
    pf = pq.ParquetFile(io.BytesIO(raw))
    items = []
    for g in range(pf.metadata.num_row_groups):
        for j in range(pf.metadata.num_columns):
            spec = chunk_spec(pf, g, j, "t.parquet")
            items.append((spec, read_pages(raw[spec.start : spec.start + spec.size], spec)))
    items.append((items[0][0], []))  # a chunk of no pages
    algorithm = PYARROW_CODECS[items[0][0].codec] if device_decompression else None
    layout = HeapLayout()
    for spec, pages in items:
        layout.add(spec, pages, algorithm)
    layout.finish()
    pieces, host, size, jobs, places = _layout_page_by_page(items, algorithm)
    assert [(at, bytes(p)) for at, p in layout.pieces] == pieces
    assert (layout.host_size, layout.size) == (host, size)
    assert {a: [tuple(j) for j in js] for a, js in layout.jobs.items()} == jobs
    got = [
        np.stack([c.body, c.body_end, c.levels, c.levels_size], axis=1).tolist()
        for c in layout.chunks
    ]
    assert got == places


def test_a_page_that_inflates_wrong_is_refused_while_packing() -> None:
    import io

    import pyarrow.parquet as pq

    from nexus_cache.frames.gpudecode import chunk_spec, read_pages

    raw = bytearray(write(_mixed_table(200), compression="snappy", data_page_version="1.0"))
    pf = pq.ParquetFile(io.BytesIO(bytes(raw)))
    spec = chunk_spec(pf, 0, 1, "t.parquet")
    pages = read_pages(bytes(raw[spec.start : spec.start + spec.size]), spec)
    last = pages[-1]
    at = last.offset - spec.start + (spec.size - (last.offset - spec.start) - len(last.payload))
    chunk = bytearray(raw[spec.start : spec.start + spec.size])
    chunk[at : at + 4] = b"\xff\xff\xff\x0f"  # the Snappy preamble: a wrong length
    pages = read_pages(bytes(chunk), spec)
    with pytest.raises(SourceFormatError, match="snappy"):
        layout_chunk(spec, pages, None)


def test_the_stage_times_cover_every_stage(device_codec: bool) -> None:
    import io

    import pyarrow.parquet as pq

    from nexus_cache.frames.gpudecode import chunk_spec, read_pages

    raw = write(_mixed_table(300), compression="zstd")
    spec = chunk_spec(pq.ParquetFile(io.BytesIO(raw)), 0, 0, "t.parquet")
    pages = read_pages(raw[spec.start : spec.start + spec.size], spec)
    stages: dict[str, float] = {}
    chunk = raw[spec.start : spec.start + spec.size]
    heap = _heap._Heap(_emulator.fake_cupy, [(chunk, spec, pages)], None, stages)
    _steps.decode_all(heap.chunks)
    heap.stage("decode")
    assert set(stages) == {"pack", "transfer", "decompress", "decode"}
    assert all(seconds >= 0 for seconds in stages.values())


@pytest.mark.parametrize("codecs", [("zstd",), ("snappy", "none", "lz4")])
def test_a_row_group_is_decoded_from_one_heap(device_codec: bool, codecs: tuple[str, ...]) -> None:
    """All chunks of a row group in one heap (one copy, one nvCOMP call per
    codec), columns of different codecs included."""
    import io

    import pyarrow.parquet as pq

    table = _mixed_table(2000)
    compression = {name: codecs[i % len(codecs)] for i, name in enumerate(table.column_names)}
    raw = write(table, compression=compression, data_page_size=1024, row_group_size=700)
    pf = pq.ParquetFile(io.BytesIO(raw))
    for g in range(pf.metadata.num_row_groups):
        items = _row_group(raw, g)
        got = _decode_together(items)
        expected = pf.read_row_group(g)
        for (_, spec, _), piece in zip(items, got, strict=True):
            assert_same(piece, expected.column(spec.column).combine_chunks(), spec.column)


def test_a_row_group_reads_back_four_times_however_many_chunks(device_codec: bool) -> None:
    """The level lengths, then one read per decode phase, for all the chunks
    of the row group together: not one per chunk or page. (Where nvCOMP
    decompresses the Snappy pages, one more before it: their stream check.)"""
    import io

    import pyarrow.parquet as pq

    table = pa.table(
        {
            f"{name}{k}": column
            for k in range(4)
            for name, column in zip(
                _mixed_table(1500).column_names, _mixed_table(1500).columns, strict=True
            )
        }
    )
    raw = write(table, compression="snappy", data_page_size=512, data_page_version="1.0")
    pf = pq.ParquetFile(io.BytesIO(raw))
    items = _row_group(raw)
    assert len(items) == 28
    assert sum(len(pages) for _, _, pages in items) > 70
    before = _emulator.READS[0]
    heap = _heap._Heap(_emulator.fake_cupy, items)
    results = _steps.decode_all(heap.chunks)
    assert _emulator.READS[0] - before == 4 + device_codec
    expected = pf.read_row_group(0)
    for (_, spec, _), got in zip(items, results, strict=True):
        assert_same(device_piece(got), expected.column(spec.column).combine_chunks(), spec.column)


def test_pages_nvcomp_refuses_are_decompressed_on_the_host(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch nvCOMP refuses is decompressed on the host instead (a warning),
    so a file nvCOMP cannot read still reads, and a corrupt page is named by
    the host's codec."""
    import io
    import logging

    import pyarrow.parquet as pq

    from nexus_cache.frames.gpudecode import read_pages
    from nexus_cache.frames.gpudecode.nvcomp import NvcompRefused

    def refuse(heap: Any, algorithm: str, jobs: Any, where: str, codecs: Any = None) -> None:
        raise NvcompRefused(f"{where}: {algorithm} pages failed to decompress on the device")

    monkeypatch.setattr(_heap, "kernel_function", _emulator.kernel_function)
    monkeypatch.setattr(_heap, "decompress_batch", refuse)
    monkeypatch.setattr(_heap, "device_algorithm", lambda codec: PYARROW_CODECS[codec])
    raw = write(_mixed_table(800), compression="zstd")
    pf = pq.ParquetFile(io.BytesIO(raw))
    items = _row_group(raw)
    with caplog.at_level(logging.WARNING, logger="nexus_cache.frames"):
        got = _decode_together(items)
    assert "decompressing these pages on the host instead" in caplog.text
    expected = pf.read_row_group(0)
    for (_, spec, _), piece in zip(items, got, strict=True):
        assert_same(piece, expected.column(spec.column).combine_chunks(), spec.column)
    # a corrupt page: the host's codec names it
    _, spec, pages = items[1]
    chunk = bytearray(raw[spec.start : spec.start + spec.size])
    last = pages[-1]
    at = len(chunk) - len(last.payload)
    chunk[at : at + 8] = bytes(8)  # the Zstd frame's magic number gone
    with pytest.raises(SourceFormatError, match="zstd decompression failed"):
        _decode_together([(bytes(chunk), spec, read_pages(bytes(chunk), spec))])
