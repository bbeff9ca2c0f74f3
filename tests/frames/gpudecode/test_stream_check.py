"""The Snappy and LZ4 stream checks run before nvCOMP (``gpudecode.stream_check``),
on the host through the emulator's line-for-line ports of the kernels: every
stream PyArrow writes passes; corrupt ones are refused without a read out of
bounds; a stream that passes, PyArrow decompresses to exactly its size; and a
Parquet file with a corrupt page never reaches nvCOMP."""

from __future__ import annotations

import importlib
import io
import logging
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.frames.gpudecode import _emulator
from tests.frames.gpudecode._check import assert_same, device_piece

from nexus_cache.errors import SourceFormatError
from nexus_cache.frames.gpudecode import chunk_spec, read_pages
from nexus_cache.frames.gpudecode.layout import layout_chunk
from nexus_cache.frames.gpudecode.nvcomp import CODEC_ALGORITHMS, NvcompRefused
from nexus_cache.frames.gpudecode.stream_check import CHECK_KERNELS, refuse_corrupt_streams

_heap = importlib.import_module("nexus_cache.frames.gpudecode._heap")
_steps = importlib.import_module("nexus_cache.frames.gpudecode._steps")

#: PyArrow's codec name -> the nvCOMP algorithm whose sections are checked
_ALGORITHM = {"snappy": "Snappy", "lz4_raw": "LZ4"}
_CODECS = sorted(_ALGORITHM)


def _launch(name: str, element_bytes: int | None, items: int, args: tuple[Any, ...]) -> None:
    """As ``_heap._launch`` does it, on the emulator (one block: the kernels
    must loop over the sections past the grid)."""
    _emulator.kernel_function(name, element_bytes)((1,), (4,), args)


def check_refuses(codec: str, stream: bytes, out_size: int) -> bool:
    """The check kernel on ``stream`` alone in a heap of exactly its size, so a
    read past its end is a read out of bounds (LaunchError)."""
    cp = _emulator.fake_cupy
    heap = cp.asarray(np.frombuffer(stream, np.uint8))
    refused = cp.zeros(1, np.int32)
    one = (cp.asarray(np.array([v], np.int64)) for v in (0, len(stream), out_size))
    _launch(CHECK_KERNELS[_ALGORITHM[codec]], None, 1, (heap, *one, refused, np.int32(1)))
    return bool(refused[0])


def _pyarrow_reads(codec: str, stream: bytes, out_size: int) -> bool:
    """Whether PyArrow decompresses ``stream`` to exactly ``out_size`` bytes.
    (PyArrow returns a buffer of the size it is given however many bytes the
    codec wrote: a stream of exactly ``out_size`` also fails one byte short.)"""

    def reads(size: int) -> bool:
        try:
            pa.Codec(codec).decompress(stream, size)
        except (pa.ArrowException, OSError, ValueError):
            return False
        return True

    if codec == "snappy":  # Snappy's own decoder checks the output against the preamble
        length, shift, pos = 0, 0, 0
        while pos < len(stream) and shift <= 28:
            length |= (stream[pos] & 0x7F) << shift
            shift, pos = shift + 7, pos + 1
            if not stream[pos - 1] & 0x80:
                break
        if length != out_size:
            return False
    return reads(out_size) and (out_size == 0 or not reads(out_size - 1))


def stream_samples() -> list[bytes]:
    rng = np.random.default_rng(11)
    out = []
    for n in (0, 1, 2, 3, 4, 5, 11, 12, 13, 17, 64, 100, 1000, 4097, 70_000, 300_000):
        out.append(rng.integers(0, 256, n, dtype=np.uint8).tobytes())  # incompressible
        out.append((np.arange(n) % 7).astype(np.uint8).tobytes())  # repetitive
        out.append(rng.integers(0, 40, n // 8 + 1).astype(np.int64).tobytes()[:n])
    return out


@pytest.mark.parametrize("codec", _CODECS)
def test_every_stream_pyarrow_writes_passes(codec: str) -> None:
    """All in one heap, each section at an odd offset, one launch."""
    samples = stream_samples()
    heap = bytearray(b"\x07" * 3)
    jobs = []
    for data in samples:
        packed = pa.Codec(codec).compress(data, asbytes=True)
        jobs.append((len(heap), len(packed), 0, len(data)))
        heap += packed + b"\x07"
    device = _emulator.fake_cupy.asarray(np.frombuffer(bytes(heap), np.uint8))
    refuse_corrupt_streams(
        _emulator.fake_cupy, device, {_ALGORITHM[codec]: jobs}, "t.parquet", _launch
    )
    for data in samples[:12]:  # and each alone, in a heap of exactly its size
        assert not check_refuses(codec, pa.Codec(codec).compress(data, asbytes=True), len(data))


@pytest.mark.parametrize("compression", ["snappy", "lz4"])
@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_every_parquet_page_pyarrow_writes_passes(compression: str, version: str) -> None:
    n = 4000
    rng = np.random.default_rng(2)
    table = pa.table(
        {
            "i": pa.array(rng.integers(0, 1 << 40, n), pa.int64(), mask=rng.random(n) < 0.1),
            "d": pa.array(rng.integers(0, 9, n), pa.int32()),
            "s": pa.array([f"k{i % 97}" * (i % 4) for i in range(n)]),
            "f": pa.array(rng.random(n)),
        }
    )
    out = io.BytesIO()
    pq.write_table(
        table, out, compression=compression, data_page_version=version, data_page_size=512
    )
    raw = out.getvalue()
    pf = pq.ParquetFile(io.BytesIO(raw))
    checked = 0
    for j in range(pf.metadata.num_columns):
        spec = chunk_spec(pf, 0, j, "t.parquet")
        pages = read_pages(raw[spec.start : spec.start + spec.size], spec)
        layout = layout_chunk(spec, pages, CODEC_ALGORITHMS[spec.codec])
        heap = np.zeros(layout.size, np.uint8)
        heap[: layout.host_size] = layout.host_image()
        device = _emulator.fake_cupy.asarray(heap)
        refuse_corrupt_streams(_emulator.fake_cupy, device, layout.jobs, "t.parquet", _launch)
        checked += sum(len(jobs) for jobs in layout.jobs.values())
    assert checked > 5


def _stream(codec: str, data: bytes) -> bytes:
    return pa.Codec(codec).compress(data, asbytes=True)


_TEXT = b"".join(b"row %d of the page, value %d; " % (i, i % 13) for i in range(200))


@pytest.mark.parametrize("codec", _CODECS)
def test_garbage_inside_a_stream_is_refused(codec: str) -> None:
    stream = bytearray(_stream(codec, _TEXT))
    assert not check_refuses(codec, bytes(stream), len(_TEXT))
    for at in (8, len(stream) // 3, len(stream) // 2):
        bad = bytearray(stream)
        bad[at : at + 32] = bytes(range(200, 232))
        assert check_refuses(codec, bytes(bad), len(_TEXT)), at
        assert not _pyarrow_reads(codec, bytes(bad), len(_TEXT))


@pytest.mark.parametrize("codec", _CODECS)
def test_every_truncation_is_refused(codec: str) -> None:
    data = _TEXT[:600]
    stream = _stream(codec, data)
    for cut in range(len(stream)):
        assert check_refuses(codec, stream[:cut], len(data)), cut


@pytest.mark.parametrize("codec", _CODECS)
@pytest.mark.parametrize("change", [-1, 1, 1000])
def test_another_size_than_the_header_says_is_refused(codec: str, change: int) -> None:
    stream = _stream(codec, _TEXT)
    assert check_refuses(codec, stream, len(_TEXT) + change)


def test_a_wrong_snappy_preamble_is_refused() -> None:
    stream = bytearray(_stream("snappy", b"abcdefgh" * 4))
    assert stream[0] == 32
    stream[0] = 31  # the preamble says one byte less than the tags produce
    assert check_refuses("snappy", bytes(stream), 31)
    assert check_refuses("snappy", bytes(stream), 32)
    # a varint longer than 5 bytes
    assert check_refuses("snappy", b"\x80\x80\x80\x80\x80\x00", 0)
    assert not check_refuses("snappy", b"\x80\x80\x80\x80\x00", 0)  # over-long, but 5 bytes


# Snappy: preamble 8, the literal "abcd" (tag (4 - 1) << 2), then a copy of 4
# bytes at a 1-byte offset (tag 1, then the offset byte).
_SNAPPY_COPY = b"\x08\x0cabcd\x01"
# LZ4: a sequence of 4 literals and an 8-byte match at a 2-byte offset, then
# the last sequence of 5 literals: 17 bytes.
_LZ4_COPY = b"\x44abcd", b"\x50efghi"


@pytest.mark.parametrize(("offset", "refused"), [(4, False), (1, False), (5, True), (0, True)])
def test_a_copy_from_before_the_output_is_refused(offset: int, refused: bool) -> None:
    snappy = _SNAPPY_COPY + bytes([offset])
    assert check_refuses("snappy", snappy, 8) is refused
    assert _pyarrow_reads("snappy", snappy, 8) is not refused
    lz4 = _LZ4_COPY[0] + offset.to_bytes(2, "little") + _LZ4_COPY[1]
    assert check_refuses("lz4_raw", lz4, 17) is refused
    if not refused:
        assert _pyarrow_reads("lz4_raw", lz4, 17)
        assert pa.Codec("lz4_raw").decompress(lz4, 17, asbytes=True)[:4] == b"abcd"


def test_a_copy_past_the_output_is_refused() -> None:
    assert check_refuses("snappy", b"\x06\x0cabcd\x01\x04", 6)  # 8 bytes of a 6-byte output
    # LZ4's last five bytes are literals: a match ending in them is refused
    lz4 = b"\x45abcd\x04\x00\x40efgh"  # a 9-byte match, then only 4 literals
    assert check_refuses("lz4_raw", lz4, 17)
    assert not _pyarrow_reads("lz4_raw", lz4, 17)
    assert not check_refuses("lz4_raw", lz4[:-5] + b"\x50efghi", 18)  # with 5: valid


def test_a_literal_past_the_input_or_the_output_is_refused() -> None:
    assert check_refuses("snappy", b"\x0a\x24abcde", 10)  # 10 literals, 5 given
    assert check_refuses("snappy", b"\x03\x10abcde", 3)  # 5 literals, 3 wanted
    assert check_refuses("snappy", b"\x0a\xf0\x09", 10)  # a literal's length byte missing
    assert check_refuses("lz4_raw", b"\xa0abcde", 10)
    assert check_refuses("lz4_raw", b"\x50abcde", 3)
    assert check_refuses("lz4_raw", b"\xf0", 20)  # the length's extension byte missing
    assert not check_refuses("lz4_raw", b"\x50abcde", 5)
    assert not check_refuses("lz4_raw", b"\x00", 0)
    assert check_refuses("lz4_raw", b"", 0)


_PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_PROPERTY
@given(
    codec=st.sampled_from(_CODECS),
    stream=st.binary(max_size=48),
    out_size=st.integers(0, 120),
)
def test_a_random_stream_is_refused_or_pyarrow_reads_it(
    codec: str, stream: bytes, out_size: int
) -> None:
    """No read out of bounds (the emulator raises on one); a stream that passes
    is one PyArrow decompresses to exactly its out size."""
    if codec == "snappy" and stream:  # a right preamble, so the tags are walked
        stream = bytes([out_size]) + stream if out_size < 128 else stream
    if not check_refuses(codec, stream, out_size):
        assert _pyarrow_reads(codec, stream, out_size)


@_PROPERTY
@given(
    codec=st.sampled_from(_CODECS),
    seed=st.integers(0, 2**32 - 1),
    length=st.integers(0, 400),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 3),
    grow=st.integers(-2, 2),
)
def test_an_edited_stream_is_refused_or_pyarrow_reads_it(
    codec: str, seed: int, length: int, edits: list[tuple[int, int]], cut: int, grow: int
) -> None:
    """Valid streams with bytes changed, cut short, or another out size: near
    misses that random bytes rarely hit."""
    rng = np.random.default_rng(seed)
    data = (rng.integers(0, 6, length) * rng.integers(1, 3)).astype(np.uint8).tobytes()
    stream = bytearray(_stream(codec, data))
    for at, value in edits:
        if stream:
            stream[at % len(stream)] = value
    stream = stream[: len(stream) - cut] if cut < len(stream) else stream
    out_size = max(0, length + grow)
    if not check_refuses(codec, bytes(stream), out_size):
        assert _pyarrow_reads(codec, bytes(stream), out_size)


def test_the_refusal_names_the_source_and_counts_the_pages() -> None:
    good, bad = _stream("snappy", _TEXT), bytearray(_stream("snappy", _TEXT))
    bad[10:42] = bytes(range(200, 232))
    lz4 = _stream("lz4_raw", _TEXT)
    heap = good + bad + good + lz4
    jobs = {
        "Snappy": [(at, len(good), 0, len(_TEXT)) for at in (0, len(good), 2 * len(good))],
        "LZ4": [(3 * len(good), len(lz4), 0, len(_TEXT))],
        "Zstd": [(0, 5, 0, 10)],  # not checked
    }
    device = _emulator.fake_cupy.asarray(np.frombuffer(bytes(heap), np.uint8))
    before = _emulator.READS[0]
    with pytest.raises(NvcompRefused, match=r"'t\.parquet', row group 3: 1 of 3 Snappy pages"):
        refuse_corrupt_streams(
            _emulator.fake_cupy, device, jobs, "'t.parquet', row group 3", _launch
        )
    assert _emulator.READS[0] - before == 1  # the flags of both codecs in one read
    del jobs["Snappy"]
    refuse_corrupt_streams(_emulator.fake_cupy, device, jobs, "t", _launch)


def _file(compression: str) -> tuple[bytes, pa.Table]:
    out = io.BytesIO()
    table = pa.table({"x": pa.array(np.arange(5000) % 91, pa.int64())})
    pq.write_table(table, out, compression=compression, use_dictionary=False)
    return out.getvalue(), table


def corrupt_chunk(compression: str) -> tuple[bytes, Any, Any]:
    """The one column chunk (bytes, spec, page) of a file of one compressed
    page, 32 bytes of garbage inside the page's stream."""
    raw, _ = _file(compression)
    spec = chunk_spec(pq.ParquetFile(io.BytesIO(raw)), 0, 0, "bad.parquet")
    chunk = bytearray(raw[spec.start : spec.start + spec.size])
    (page,) = read_pages(bytes(chunk), spec)
    at = len(chunk) - len(page.payload)
    chunk[at + 8 : at + 40] = bytes(range(200, 232))
    return bytes(chunk), spec, page


@pytest.mark.parametrize(
    ("compression", "algorithm", "codec"),
    [("snappy", "Snappy", "snappy"), ("lz4", "LZ4", "lz4_raw")],
)
def test_a_corrupt_page_never_reaches_nvcomp(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    compression: str,
    algorithm: str,
    codec: str,
) -> None:
    """The device decode of a file with a corrupt page: the check refuses the
    batch before nvCOMP is called, and the host's decompression names the
    page. The file uncorrupted, through the same path, reaches nvCOMP."""
    calls: list[str] = []

    def nvcomp_decode(heap: Any, name: str, jobs: Any, where: str, codecs: Any = None) -> None:
        calls.append(name)
        for source, size, target, want in jobs:
            got = pa.Codec(codec).decompress(bytes(heap[source : source + size]), want)
            heap[target : target + want] = np.frombuffer(got, np.uint8)

    monkeypatch.setattr(_heap, "kernel_function", _emulator.kernel_function)
    monkeypatch.setattr(_heap, "decompress_batch", nvcomp_decode)
    monkeypatch.setattr(_heap, "device_algorithm", CODEC_ALGORITHMS.get)
    chunk, spec, page = corrupt_chunk(compression)
    refused = pytest.raises(SourceFormatError, match=f"byte {page.offset}: {codec} decompression")
    with caplog.at_level(logging.WARNING, logger="nexus_cache.frames"), refused:
        _heap._Heap(_emulator.fake_cupy, [(chunk, spec, read_pages(chunk, spec))])
    assert calls == []
    assert f"1 of 1 {algorithm} pages failed the stream check" in caplog.text
    raw, table = _file(compression)
    good = raw[spec.start : spec.start + spec.size]
    heap = _heap._Heap(_emulator.fake_cupy, [(good, spec, read_pages(good, spec))])
    assert calls == [algorithm]
    (got,) = _steps.decode_all(heap.chunks)
    assert_same(device_piece(got), table.column("x").combine_chunks(), "x")
