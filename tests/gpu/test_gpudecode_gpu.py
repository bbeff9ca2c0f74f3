"""The page-decode kernels on a real GPU: a column chunk decoded on the device
equals PyArrow's decode (and the NumPy reference), bit for bit.

Run on the GPU machine (CuPy, one GPU); skipped elsewhere by tests/conftest.py.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from tests.frames._tables import assert_same_table
from tests.frames.gpudecode._check import check_file, device_piece
from tests.frames.gpudecode.test_dictionary import (
    VALUE_TYPES,
    corrupt_dictionary_index_chunk,
    different_dictionaries,
    equal_dictionaries,
    on_the_host,
    plain_file,
)
from tests.frames.gpudecode.test_launches import many_pages_file
from tests.frames.gpudecode.test_reference import WRITE_OPTIONS, tables, write
from tests.frames.gpudecode.test_refusals import CODECS, long_run_file, short_page_file
from tests.frames.gpudecode.test_stream_check import check_refuses, corrupt_chunk, stream_samples
from tests.frames.gpudecode.test_tiles import _plain_lengths, _prefixed, large_pages_file

from nexus_cache.errors import SourceFormatError
from nexus_cache.frames import DecodeStats, decode_parquet
from nexus_cache.frames._host import HostPiece
from nexus_cache.frames.gpudecode import ChunkSpec, Page, chunk_spec, read_pages
from nexus_cache.frames.gpudecode.device import decode_chunk_on_device

pytestmark = pytest.mark.gpu


@pytest.fixture
def domain() -> Any:
    pytest.importorskip("cupy")
    from nexus_cache.backends import select_backend

    backend = select_backend()
    made = backend.create_domain(0)
    yield made
    made.close()


def _on_device_equals_pyarrow(
    raw: bytes, domain: Any, read_dictionary: list[str] | None = None
) -> None:
    def decode(chunk: bytes, spec: ChunkSpec, pages: list[Page]) -> HostPiece:
        got = decode_chunk_on_device(chunk, spec, domain, pages)
        return device_piece(got, spec.arrow_type)

    check_file(raw, decode=decode, read_dictionary=read_dictionary)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(table=tables(), options=WRITE_OPTIONS)
def test_device_decode_equals_pyarrow(
    domain: Any, table: pa.Table, options: dict[str, Any]
) -> None:
    _on_device_equals_pyarrow(write(table, **options), domain)


def test_large_chunk_on_device(domain: Any) -> None:
    rng = np.random.default_rng(11)
    n = 300_000
    mask = rng.random(n) < 0.1
    table = pa.table(
        {
            "i": pa.array(rng.integers(0, 1 << 40, n), pa.int64(), mask=mask),
            "d": pa.array(rng.integers(0, 100, n), pa.int64()),
            "f": pa.array(rng.random(n)),
            "s": pa.array([f"k{i % 1000}" for i in range(n)], mask=mask),
            "b": pa.array(rng.random(n) < 0.5, mask=mask),
        }
    )
    _on_device_equals_pyarrow(write(table, compression="zstd", data_page_version="2.0"), domain)


def corrupt_index_chunk() -> tuple[bytes, Any]:
    """A chunk whose one data page's dictionary indices claim 8 bits each, for
    a 2-entry dictionary: indices past the dictionary (or runs past the page)."""
    out = io.BytesIO()
    table = pa.table({"x": pa.array([1, 2, 1, 2] * 10, pa.int64())})
    pq.write_table(table, out, compression="none", data_page_version="1.0")
    raw = out.getvalue()
    spec = chunk_spec(pq.ParquetFile(io.BytesIO(raw)), 0, 0, "bad.parquet")
    chunk = bytearray(raw[spec.start : spec.start + spec.size])
    _, data_page = read_pages(bytes(chunk), spec)
    payload_at = len(chunk) - len(data_page.payload)  # the data page is the last
    levels = int.from_bytes(chunk[payload_at : payload_at + 4], "little")
    chunk[payload_at + 4 + levels] = 8  # the bit width byte of the index stream
    return bytes(chunk), spec


def test_a_corrupt_index_stream_is_refused_on_device(domain: Any) -> None:
    chunk, spec = corrupt_index_chunk()
    with pytest.raises(SourceFormatError):
        decode_chunk_on_device(chunk, spec, domain)


def _read_with_gpu_engine(
    raw: bytes, domain: Any, tmp: Path, read_dictionary: list[str] | None = None
) -> tuple[pa.Table, DecodeStats]:
    path = tmp / "t.parquet"
    path.write_bytes(raw)
    stats = DecodeStats()
    frame = decode_parquet(
        path, domain=domain, engine="gpu", stats=stats, read_dictionary=read_dictionary
    )
    try:
        return frame.to_arrow(), stats
    finally:
        frame.release()


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(table=tables(), options=WRITE_OPTIONS)
def test_gpu_engine_equals_pyarrow(domain: Any, table: pa.Table, options: dict[str, Any]) -> None:
    raw = write(table, **options)
    with tempfile.TemporaryDirectory() as tmp:
        got, stats = _read_with_gpu_engine(raw, domain, Path(tmp))
    expected = pq.read_table(io.BytesIO(raw))
    assert _bits(got).equals(_bits(expected))
    assert stats.paths == dict.fromkeys(table.column_names, "gpu") or table.num_rows == 0


def _bits(table: pa.Table) -> pa.Table:
    """``table`` with floating columns viewed as integers of their width, so equality
    is bit for bit (a NaN equals the same NaN, as the decoder promises)."""
    widths = {16: pa.int16(), 32: pa.int32(), 64: pa.int64()}
    columns = [
        c.combine_chunks().view(widths[c.type.bit_width]) if pa.types.is_floating(c.type) else c
        for c in table.columns
    ]
    return pa.table(columns, names=table.column_names)


def test_gpu_engine_sends_unsupported_columns_to_the_host(domain: Any, tmp_path: Path) -> None:
    table = pa.table(
        {
            "i": pa.array(np.arange(1000), pa.int64()),
            "u": pa.array(np.arange(1000), pa.uint32()),
            "s": pa.array([f"x{i % 7}" for i in range(1000)]),
        }
    )
    raw = write(table, row_group_size=300)
    got, stats = _read_with_gpu_engine(raw, domain, tmp_path)
    assert got.equals(table)
    assert stats.paths["i"] == "gpu"
    assert stats.paths["s"] == "gpu"
    assert stats.paths["u"].startswith("host: type uint32")


def test_warm_up_loads_the_decode_kernels_under_auto(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm-up loads every page-decode kernel (each typed one for every
    element size) when the engine is auto on CUDA, listed with the others."""
    pytest.importorskip("cupy")
    from nexus_cache.backends import select_backend
    from nexus_cache.frames.gpudecode.kernels import ELEMENT_TYPES, KERNEL_NAMES, TYPED_KERNELS
    from nexus_cache.service.warmup import warm_up_device

    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(tmp_path / "programs"))
    monkeypatch.setenv("NEXUS_DECODE_ENGINE", "auto")
    backend = select_backend()
    made = backend.create_domain(0)
    try:
        report = warm_up_device(backend, 0, made)
    finally:
        made.close()
    assert "decode kernels" in report.steps
    from nexus_cache._kernel_loader import kernel_loads

    labels = {k.kernel for k in kernel_loads()}
    for name in KERNEL_NAMES:
        for size in ELEMENT_TYPES if name in TYPED_KERNELS else (None,):
            assert (name if size is None else f"{name}({size} bytes)") in labels


@pytest.mark.parametrize(
    ("codec", "path"),
    [
        ("snappy", "gpu"),
        ("lz4", "gpu"),
        ("none", "gpu"),
        ("zstd", "host: codec ZSTD is not checked before nvCOMP"),
        ("gzip", "host: codec GZIP is not checked before nvCOMP"),
    ],
)
def test_auto_leaves_unchecked_codecs_to_the_host(
    codec: str, path: str, domain: Any, tmp_path: Path
) -> None:
    """Under auto: Snappy, LZ4_RAW and uncompressed columns on the GPU, Zstd
    and Gzip ones on the host; the rows are PyArrow's either way."""
    pytest.importorskip("nvidia.nvcomp")
    file = tmp_path / "t.parquet"
    file.write_bytes(write(_codec_table(30_000), compression=codec, row_group_size=10_000))
    stats = DecodeStats()
    frame = decode_parquet(file, domain=domain, stats=stats, engine="auto")
    try:
        assert_same_table(frame.to_arrow(), pq.read_table(file))
    finally:
        frame.release()
    assert all(p.startswith(path) for p in stats.paths.values()), stats.paths


def _codec_table(n: int = 200_000) -> pa.Table:
    rng = np.random.default_rng(3)
    mask = rng.random(n) < 0.15
    return pa.table(
        {
            "i": pa.array(rng.integers(0, 1 << 40, n), pa.int64(), mask=mask),
            "d": pa.array(rng.integers(0, 50, n), pa.int32()),
            "f": pa.array(rng.random(n)),
            "b": pa.array(rng.random(n) < 0.5, mask=mask),
            "s": pa.array([f"k{i % 997}" for i in range(n)], mask=mask),
            "u": pa.array([f"u{i}" for i in range(n)]),
        }
    )


@pytest.mark.parametrize("codec", ["snappy", "zstd", "lz4", "gzip", "none"])
@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_pages_are_decompressed_on_the_device_by_nvcomp(
    domain: Any, tmp_path: Path, codec: str, version: str, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    pytest.importorskip("nvidia.nvcomp")
    table = _codec_table()
    raw = write(table, compression=codec, data_page_version=version, row_group_size=70_000)
    with caplog.at_level(logging.WARNING, logger="nexus_cache.frames"):
        got, stats = _read_with_gpu_engine(raw, domain, tmp_path)
    # nvCOMP read every page (no batch fell back to the host)
    assert "on the host instead" not in caplog.text
    assert got.equals(pq.read_table(io.BytesIO(raw)))
    assert stats.paths == dict.fromkeys(table.column_names, "gpu")


def test_without_nvcomp_the_host_decompresses(
    domain: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from nexus_cache.frames.gpudecode import nvcomp

    monkeypatch.setitem(sys.modules, "nvidia.nvcomp", None)  # as if not installed
    nvcomp.nvcomp_module.cache_clear()
    try:
        table = _codec_table(50_000)
        raw = write(table, compression="zstd", data_page_version="2.0")
        got, stats = _read_with_gpu_engine(raw, domain, tmp_path)
    finally:
        monkeypatch.undo()
        nvcomp.nvcomp_module.cache_clear()
    assert got.equals(pq.read_table(io.BytesIO(raw)))
    assert stats.paths == dict.fromkeys(table.column_names, "gpu (host decompression)")


def test_a_corrupt_compressed_page_is_refused_on_device(domain: Any) -> None:
    pytest.importorskip("nvidia.nvcomp")
    out = io.BytesIO()
    table = pa.table({"x": pa.array(np.arange(5000) % 91, pa.int64())})
    pq.write_table(table, out, compression="snappy", use_dictionary=False)
    raw = out.getvalue()
    spec = chunk_spec(pq.ParquetFile(io.BytesIO(raw)), 0, 0, "bad.parquet")
    chunk = bytearray(raw[spec.start : spec.start + spec.size])
    (page,) = read_pages(bytes(chunk), spec)
    at = len(chunk) - len(page.payload)
    chunk[at + 8 : at + 40] = bytes(range(200, 232))  # garbage inside the Snappy stream
    with pytest.raises(SourceFormatError, match=f"byte {page.offset}: snappy decompression"):
        decode_chunk_on_device(bytes(chunk), spec, domain)


@pytest.mark.parametrize(("compression", "codec"), [("snappy", "snappy"), ("lz4", "lz4_raw")])
def test_after_a_corrupt_page_the_device_still_decodes(
    domain: Any, compression: str, codec: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The stream check keeps a corrupt page from nvCOMP, whose read out of
    bounds would poison the CUDA context: after the refusal, the same process
    decodes a valid file on the same device, bit for bit."""
    import logging

    pytest.importorskip("nvidia.nvcomp")
    import cupy as cp

    chunk, spec, page = corrupt_chunk(compression)
    before = domain.used_bytes()
    refused = pytest.raises(SourceFormatError, match=f"byte {page.offset}: {codec} decompression")
    with caplog.at_level(logging.WARNING, logger="nexus_cache.frames"), refused:
        decode_chunk_on_device(chunk, spec, domain)
    assert "failed the stream check" in caplog.text  # refused before nvCOMP
    assert domain.used_bytes() == before  # the refused heap went back
    cp.cuda.runtime.deviceSynchronize()  # raises where a kernel faulted
    raw = write(_codec_table(60_000), compression=compression, data_page_version="1.0")
    _on_device_equals_pyarrow(raw, domain)


@pytest.mark.parametrize("codec", ["snappy", "lz4_raw"])
def test_the_check_kernels_agree_with_their_host_ports(codec: str) -> None:
    """Valid streams, cut short, with garbage inside, or of another size: the
    CUDA kernel refuses exactly what its emulator port refuses (a grid smaller
    than the streams, so each thread loops)."""
    import cupy as cp

    from nexus_cache.frames.gpudecode.kernels import kernel_function
    from nexus_cache.frames.gpudecode.stream_check import CHECK_KERNELS

    streams: list[tuple[bytes, int]] = []
    for data in stream_samples():
        packed = pa.Codec(codec).compress(data, asbytes=True)
        streams += [(packed, len(data)), (packed[:-1], len(data)), (packed, len(data) + 1)]
        if len(packed) > 40:
            bad = bytearray(packed)
            bad[8:40] = bytes(range(200, 232))
            streams.append((bytes(bad), len(data)))
    heap = b"".join(s for s, _ in streams)
    starts = np.cumsum([0] + [len(s) for s, _ in streams[:-1]]).astype(np.int64)
    sizes = np.array([len(s) for s, _ in streams], np.int64)
    outs = np.array([n for _, n in streams], np.int64)
    refused = cp.zeros(len(streams), np.int32)
    name = CHECK_KERNELS["Snappy" if codec == "snappy" else "LZ4"]
    kernel_function(name)(
        (2,),
        (32,),
        (
            cp.asarray(np.frombuffer(heap, np.uint8)),
            cp.asarray(starts),
            cp.asarray(sizes),
            cp.asarray(outs),
            refused,
            np.int32(len(streams)),
        ),
    )
    expected = [int(check_refuses(codec, s, n)) for s, n in streams]
    assert refused.get().tolist() == expected
    assert 0 < sum(expected) < len(expected)


def test_a_row_group_of_mixed_codecs_and_its_stage_times(
    domain: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The row groups' chunks share heaps, one nvCOMP call per codec each, and
    every valid page is decompressed on the device (the stream check refuses
    none of them, so none goes to the host)."""
    import logging

    pytest.importorskip("nvidia.nvcomp")
    table = _codec_table(120_000)
    codecs = ["snappy", "zstd", "lz4", "none", "gzip", "snappy"]
    compression = dict(zip(table.column_names, codecs, strict=True))
    raw = write(table, compression=compression, row_group_size=40_000)
    with caplog.at_level(logging.WARNING, logger="nexus_cache.frames"):
        got, stats = _read_with_gpu_engine(raw, domain, tmp_path)
    assert "on the host instead" not in caplog.text
    assert got.equals(pq.read_table(io.BytesIO(raw)))
    assert set(stats.gpu_stages) == {"pack", "transfer", "decompress", "decode"}
    assert stats.gpu_stages["decode"] > 0


@pytest.mark.parametrize("codec", ["snappy", "zstd", "lz4_raw", "gzip"])
def test_nvcomp_reports_the_size_each_page_decompressed_to(codec: str) -> None:
    """A page that inflates to fewer bytes than its header says is refused:
    ``decompress_batch`` checks the sizes nvCOMP reports, which must be the
    sizes decompressed, not the output slots' capacities."""
    pytest.importorskip("nvidia.nvcomp")
    import cupy as cp

    from nexus_cache.frames.gpudecode.nvcomp import (
        ALIGNMENT,
        CODEC_ALGORITHMS,
        NvcompRefused,
        decompress_batch,
    )

    plain = np.arange(20_000, dtype=np.int64).tobytes()
    packed = pa.compress(plain, codec=codec, asbytes=True)
    out_at = (len(packed) + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
    algorithm = CODEC_ALGORITHMS["LZ4_RAW" if codec == "lz4_raw" else codec.upper()]

    def heap_and_jobs(want: int) -> tuple[Any, list[tuple[int, int, int, int]]]:
        heap = cp.zeros(out_at + want + ALIGNMENT, np.uint8)
        heap[: len(packed)] = cp.asarray(np.frombuffer(packed, np.uint8))
        assert heap.data.ptr % ALIGNMENT == 0
        return heap, [(0, len(packed), out_at, want)]

    heap, jobs = heap_and_jobs(len(plain))
    decompress_batch(heap, algorithm, jobs, "t.parquet")
    assert heap[out_at : out_at + len(plain)].get().tobytes() == plain
    heap, jobs = heap_and_jobs(len(plain) + 64)  # the header claims 64 bytes more
    with pytest.raises(NvcompRefused, match="decompressed to"):
        decompress_batch(heap, algorithm, jobs, "t.parquet")


def test_a_capped_grid_decodes_every_page_on_device(
    domain: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One block of 256 threads for every launch: the kernels with one thread
    per page or stream loop over the others."""
    import importlib

    heap_module = importlib.import_module("nexus_cache.frames.gpudecode._heap")
    monkeypatch.setattr(heap_module, "_MAX_BLOCKS", 1)
    _on_device_equals_pyarrow(many_pages_file("snappy"), domain)


def test_decode_on_a_non_blocking_stream(domain: Any) -> None:
    """Kernels, CuPy work and nvCOMP all run on the caller's current stream (a
    non-blocking one: no implicit order with the null stream)."""
    import cupy as cp

    raw = write(_codec_table(60_000), compression="snappy", data_page_version="1.0")
    with cp.cuda.Device(0), cp.cuda.Stream(non_blocking=True):
        _on_device_equals_pyarrow(raw, domain)


def test_the_decode_kernels_load_through_the_program_cache(domain: Any) -> None:
    """Not CuPy's fallback compile, which would hide a broken cubin load."""
    from nexus_cache._kernel_loader import kernel_loads
    from nexus_cache.frames.gpudecode.kernels import KERNEL_NAMES

    _on_device_equals_pyarrow(write(_codec_table(5_000), compression="zstd"), domain)
    loads = [k for k in kernel_loads() if k.kernel.split("(")[0] in KERNEL_NAMES]
    assert loads
    assert {k.origin for k in loads} <= {"compiled", "program-cache"}, loads


@pytest.mark.parametrize("version", ["1.0", "2.0"])
@pytest.mark.parametrize("compression", sorted(CODECS))
def test_a_page_that_decompresses_short_is_refused_on_device(
    domain: Any, compression: str, version: str
) -> None:
    """A page whose stream inflates to 8 bytes fewer than its header says: the
    stream check (Snappy, LZ4) or nvCOMP's reported size (Zstd, Gzip) refuses
    it, the host's decompression names it, and no byte stays in the domain."""
    raw, offset = short_page_file(compression, version)
    spec = chunk_spec(pq.ParquetFile(io.BytesIO(raw)), 0, 0, "bad.parquet")
    chunk = raw[spec.start : spec.start + spec.size]
    before = domain.used_bytes()
    codec = CODECS[compression]
    short = f"byte {offset}: {codec} (data decompressed to |decompression failed)"
    with pytest.raises(SourceFormatError, match=short):
        decode_chunk_on_device(chunk, spec, domain)
    assert domain.used_bytes() == before


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_a_bit_packed_run_longer_than_its_stream_is_refused_on_device(
    domain: Any, version: str
) -> None:
    """The ``hybrid_runs`` kernel refuses a level run declaring 2 bytes more than
    its stream holds, as PyArrow does; no byte stays in the domain."""
    raw, _ = long_run_file(version)
    spec = chunk_spec(pq.ParquetFile(io.BytesIO(raw)), 0, 0, "bad.parquet")
    (page,) = read_pages(raw[spec.start : spec.start + spec.size], spec)
    # the levels' first run header: where the page's body starts (after the
    # 4-byte length of a v1 page's levels)
    at = spec.start + spec.size - len(page.payload) + (4 if version == "1.0" else 0)
    bad = bytearray(raw)
    assert bad[at] == 5 << 1 | 1
    bad[at] = 7 << 1 | 1
    before = domain.used_bytes()
    with pytest.raises(SourceFormatError, match=r"bad\.parquet.*malformed"):
        decode_chunk_on_device(bytes(bad[spec.start : spec.start + spec.size]), spec, domain)
    assert domain.used_bytes() == before


@pytest.mark.parametrize("compression", ["none", "snappy", "lz4"])
def test_pages_larger_than_a_tile_on_device(domain: Any, compression: str) -> None:
    """PLAIN string pages of several shared-memory tiles, one string longer than a
    tile: ``plain_lengths`` and the stream checks walk them tile by tile."""
    _on_device_equals_pyarrow(large_pages_file(compression), domain)


def test_plain_lengths_agrees_with_its_host_port_across_tiles() -> None:
    """Pages of several tiles, good and with a length past the end in a later
    tile, one block each (a grid of 2 blocks, so each block loops): the CUDA
    kernel writes and refuses exactly what its emulator port does."""
    import cupy as cp

    from nexus_cache.frames.gpudecode._tile import TILE_BYTES
    from nexus_cache.frames.gpudecode.kernels import kernel_function

    strings = [b"%d" % i * (i % 9) for i in range(TILE_BYTES // 5)]
    good = _prefixed(strings)
    pages = [
        (good, len(strings)),
        (good + (5).to_bytes(4, "little") + b"abcd", len(strings) + 1),
        (good + b"\x01\x00", len(strings) + 1),
        (b"", 0),
        (_prefixed([b"y" * (3 * TILE_BYTES), b"", b"z"]), 3),
    ]
    heap = b"".join(p for p, _ in pages)
    starts = np.cumsum([0] + [len(p) for p, _ in pages[:-1]]).astype(np.int64)
    ends = starts + np.array([len(p) for p, _ in pages], np.int64)
    counts = np.array([n for _, n in pages], np.int64)
    base = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    total = int(counts.sum())
    out_start, out_length = cp.zeros(total, np.int64), cp.zeros(total, np.int64)
    errors = []
    for k in range(len(pages)):  # one launch a page, for each page's error flag
        error = cp.zeros(1, np.int32)
        kernel_function("plain_lengths")(
            (2,),
            (256,),
            (
                cp.asarray(np.frombuffer(heap, np.uint8)),
                cp.asarray(starts[k : k + 1]),
                cp.asarray(ends[k : k + 1]),
                cp.asarray(base[k : k + 1]),
                cp.asarray(counts[k : k + 1]),
                out_start,
                out_length,
                error,
                np.int32(1),
            ),
        )
        errors.append(int(error.get()[0]))
    got_start, got_length = out_start.get(), out_length.get()
    for k, (page, count) in enumerate(pages):
        error, want_start, want_length = _plain_lengths(page, count)
        assert errors[k] == error, k
        span = slice(int(base[k]), int(base[k]) + count)
        # the port's page starts at 0, this one at starts[k] (a written start is
        # at least 4, past its prefix; one not written stays 0)
        assert got_start[span].tolist() == [s + int(starts[k]) if s else 0 for s in want_start], k
        assert got_length[span].tolist() == want_length, k
    assert errors == [0, 1, 1, 0, 0]


@pytest.mark.parametrize("value_type", VALUE_TYPES, ids=str)
@pytest.mark.parametrize("make", [equal_dictionaries, different_dictionaries])
def test_dictionary_columns_are_decoded_on_device(
    domain: Any, tmp_path: Path, value_type: pa.DataType, make: Any
) -> None:
    """Row groups of equal and of different dictionaries, nulls, an empty row
    group: each chunk equals PyArrow's, and the GPU engine's frame equals the
    host engine's (dictionaries joined alike) and PyArrow's."""
    raw = make(value_type)
    _on_device_equals_pyarrow(raw, domain)
    got, stats = _read_with_gpu_engine(raw, domain, tmp_path)
    assert stats.paths == {"c": "gpu"}
    assert_same_table(got, pq.read_table(io.BytesIO(raw)))
    assert got.equals(on_the_host(raw, tmp_path))


def test_a_string_column_read_as_a_dictionary_on_device(domain: Any, tmp_path: Path) -> None:
    raw = plain_file(fallback=False)
    _on_device_equals_pyarrow(raw, domain, read_dictionary=["c"])
    got, stats = _read_with_gpu_engine(raw, domain, tmp_path, read_dictionary=["c"])
    assert stats.paths == {"c": "gpu"}
    assert_same_table(got, pq.read_table(io.BytesIO(raw), read_dictionary=["c"]))
    assert got.equals(on_the_host(raw, tmp_path, read_dictionary=["c"]))


def test_a_dictionary_chunk_that_fell_back_to_plain_is_read_on_the_host(
    domain: Any, tmp_path: Path
) -> None:
    raw = plain_file(fallback=True)
    got, stats = _read_with_gpu_engine(raw, domain, tmp_path, read_dictionary=["c"])
    assert stats.paths["c"].startswith(
        "host: PLAIN data pages (the writer gave up on the dictionary) read as dictionary<"
    )
    assert_same_table(got, pq.read_table(io.BytesIO(raw), read_dictionary=["c"]))


def test_an_index_past_the_dictionary_is_refused_on_device(domain: Any) -> None:
    chunk, spec = corrupt_dictionary_index_chunk()
    with pytest.raises(SourceFormatError, match="malformed"):
        decode_chunk_on_device(chunk, spec, domain)


def test_the_cold_read_benchmarks_file_decodes_every_column_on_device(
    domain: Any, tmp_path: Path
) -> None:
    """Every column of ``cold_read.py``'s numbers-and-strings file, the
    dictionary column ``cat`` included, goes to the GPU."""
    from benchmarks.source_cache import make_parquet

    path = tmp_path / "bench.parquet"
    make_parquet(path, 8 << 20, group_rows=50_000)
    stats = DecodeStats()
    frame = decode_parquet(path, domain=domain, engine="gpu", stats=stats)
    try:
        got = frame.to_arrow()
    finally:
        frame.release()
    assert set(stats.paths.values()) == {"gpu"}, stats.paths
    assert_same_table(got, pq.read_table(path))
    assert got.equals(on_the_host(path.read_bytes(), tmp_path))


@pytest.mark.parametrize("compression", ["none", "snappy"])
def test_row_groups_merged_per_column_equal_pyarrow_on_device(
    domain: Any, tmp_path: Path, compression: str
) -> None:
    """Six row groups, each with its own dictionaries (one column falls back to
    PLAIN in each): every column's chunks decoded as one by the engine."""
    from tests.frames.gpudecode.test_device_plan import _mixed_table

    raw = write(_mixed_table(3000), row_group_size=500, compression=compression)
    got, stats = _read_with_gpu_engine(raw, domain, tmp_path)
    assert set(stats.paths.values()) == {"gpu"}, stats.paths
    assert _bits(got).equals(_bits(pq.read_table(io.BytesIO(raw))))


@pytest.mark.parametrize("value_type", [pa.int64(), pa.string()], ids=str)
def test_an_index_past_its_own_row_groups_dictionary_is_refused_on_device(
    domain: Any, value_type: pa.DataType
) -> None:
    from tests.frames.gpudecode.test_merged_columns import _items, _with_index_past_its_dictionary

    from nexus_cache.frames.gpudecode.device import decode_chunks_on_device

    _, items = _items(_with_index_past_its_dictionary(value_type))
    with pytest.raises(SourceFormatError, match="of one of row groups 0, 1"):
        decode_chunks_on_device(items, domain, columns=[[0, 1]])
    # the device still decodes afterwards
    (got,) = decode_chunks_on_device(items[:1], domain)
    assert got.length == 1000
