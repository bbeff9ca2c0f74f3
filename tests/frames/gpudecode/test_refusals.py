"""Pages PyArrow refuses are refused by the page decoder too, on the host (the
NumPy reference and the host decompression of the device path) and on the
emulated device (``_emulator``), and a refused decode leaves nothing in the
domain: a page that decompresses to fewer bytes than its header says, and a
level stream whose bit-packed run is longer than the stream."""

from __future__ import annotations

import importlib
import io
import logging
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.frames.gpudecode import _emulator
from tests.frames.gpudecode._check import assert_same, device_piece
from tests.frames.gpudecode.test_stream_check import corrupt_chunk

from nexus_cache.errors import SourceFormatError
from nexus_cache.frames.gpudecode import ChunkSpec, chunk_spec, decode_chunk, read_pages
from nexus_cache.frames.gpudecode._hybrid import HybridError, hybrid_expand, hybrid_runs
from nexus_cache.frames.gpudecode.layout import layout_chunk

_device = importlib.import_module("nexus_cache.frames.gpudecode.device")

#: PyArrow's compression name -> the codec in the page decoder's messages
CODECS = {"snappy": "snappy", "gzip": "gzip", "zstd": "zstd", "lz4": "lz4_raw"}


def _write(table: pa.Table, **options: Any) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out, use_dictionary=False, **options)
    return out.getvalue()


def _chunk(raw: bytes) -> tuple[bytes, ChunkSpec]:
    spec = chunk_spec(pq.ParquetFile(io.BytesIO(raw)), 0, 0, "bad.parquet")
    return raw[spec.start : spec.start + spec.size], spec


def _pyarrow_refuses(raw: bytes, match: str) -> None:
    with pytest.raises((OSError, pa.ArrowException), match=match):
        pq.read_table(io.BytesIO(raw))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def short_page_file(compression: str, version: str) -> tuple[bytes, int]:
    """A file of one int64 page (32 rows) whose header says its data inflates to
    8 bytes more than its stream does; and the page's offset in the file. One
    number of the header changed: the stream is valid, so every codec
    decompresses it without an error, 8 bytes short."""
    table = pa.table({"x": pa.array(np.arange(32) * 7919, pa.int64())})
    raw = bytearray(_write(table, compression=compression, data_page_version=version))
    chunk, spec = _chunk(bytes(raw))
    (page,) = read_pages(chunk, spec)
    size = page.header.uncompressed_size
    # the header: field 1 (type, i32: 0x15, 0) then field 2 (uncompressed size, i32)
    at = spec.start + 3
    old, new = _varint(size << 1), _varint((size + 8) << 1)  # zigzag
    assert raw[at - 1] == 0x15
    assert raw[at : at + len(old)] == old
    assert len(new) == len(old)
    raw[at : at + len(new)] = new
    return bytes(raw), page.offset


@pytest.mark.parametrize("version", ["1.0", "2.0"])
@pytest.mark.parametrize("compression", sorted(CODECS))
def test_a_page_that_decompresses_short_is_refused(
    compression: str, version: str, emulated_device: Any, caplog: pytest.LogCaptureFixture
) -> None:
    raw, offset = short_page_file(compression, version)
    # (PyArrow's Zstd codec checks the size itself; the others leave it to the reader)
    _pyarrow_refuses(raw, "didn't decompress to expected size|Corrupt ZSTD")
    chunk, spec = _chunk(raw)
    (page,) = read_pages(chunk, spec)
    codec = CODECS[compression]
    short = f"byte {offset}: {codec} (data decompressed to |decompression failed)"
    with pytest.raises(SourceFormatError, match=short):
        decode_chunk(chunk, spec)
    with pytest.raises(SourceFormatError, match=short):  # the host's decompression
        layout_chunk(spec, [page], None)
    # the device: the stream check (Snappy, LZ4) or nvCOMP's size (Zstd, Gzip)
    # refuses it, and the host's decompression names the page
    domain = _emulator.Domain()
    logs = caplog.at_level(logging.WARNING, logger="nexus_cache.frames")
    with logs, pytest.raises(SourceFormatError, match=short):
        _device.decode_chunks_on_device([(chunk, spec, None)], domain)
    assert "decompressing these pages on the host instead" in caplog.text
    assert domain.used_bytes() == 0


def long_run_file(version: str) -> tuple[bytes, pa.Table]:
    """A nullable int64 page of 40 rows whose definition levels are one
    bit-packed run of 5 groups of 8; returns the file and the table."""
    mask = np.arange(40) % 3 == 0
    table = pa.table({"x": pa.array(np.arange(40), pa.int64(), mask=mask)})
    return _write(table, compression="none", data_page_version=version), table


def _levels_at(chunk: bytes, spec: ChunkSpec, version: str) -> int:
    """Where the definition levels' first run header is in the chunk."""
    (page,) = read_pages(chunk, spec)
    body = len(chunk) - len(page.payload)
    return body + (4 if version == "1.0" else 0)  # a v1 page: after their length


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_a_bit_packed_run_longer_than_its_stream_is_refused(
    version: str, emulated_device: Any
) -> None:
    raw, table = long_run_file(version)
    chunk, spec = _chunk(raw)
    assert_same(decode_chunk(chunk, spec), table.column("x").combine_chunks(), "x")
    at = _levels_at(chunk, spec, version)
    assert chunk[at] == 5 << 1 | 1  # 5 groups of 8 levels, 5 bytes of 1-bit levels
    bad = bytearray(raw)
    bad[spec.start + at] = 7 << 1 | 1  # 7 groups: 2 bytes past the stream
    bad_chunk, _ = _chunk(bytes(bad))
    _pyarrow_refuses(bytes(bad), "rep / def levels do not match")
    with pytest.raises(SourceFormatError, match="bit-packed run of 56 values runs past"):
        decode_chunk(bad_chunk, spec)
    domain = _emulator.Domain()
    with pytest.raises(SourceFormatError, match="malformed"):
        _device.decode_chunks_on_device([(bad_chunk, spec, None)], domain)
    assert domain.used_bytes() == 0


def test_run_headers_as_pyarrow_reads_them() -> None:
    """A run of no values is refused, and a bit-packed run past the stream's end
    too, but for its last group, which some writers cut short."""
    ones = b"\x50\x01"  # RLE: 40 ones
    assert hybrid_expand(ones, hybrid_runs(ones, 1, 40)).tolist() == [1] * 40
    for empty in (b"\x00\x01" + ones, b"\x01" + ones):  # an RLE run, a bit-packed run
        with pytest.raises(HybridError, match=r"no values|0 groups"):
            hybrid_runs(empty, 1, 40)
    # 3 groups of 8 3-bit values need 9 bytes: 8 hold 21 values, past 2 groups
    cut = b"\x07" + bytes(range(8))
    assert len(hybrid_expand(cut, hybrid_runs(cut, 3, 21))) == 21
    with pytest.raises(HybridError):  # 22 values: more than the stream holds
        hybrid_runs(cut, 3, 22)
    # 6 bytes hold 16 values: no more than 2 of the 3 groups, refused whole
    with pytest.raises(HybridError, match="runs past the end"):
        hybrid_runs(cut[:7], 3, 8)
    with pytest.raises(HybridError, match="wider than 32 bits"):
        hybrid_runs(b"\xff\xff\xff\xff\x7f\x01", 1, 1)


@pytest.mark.parametrize("compression", ["snappy", "lz4"])
def test_a_refused_page_leaves_nothing_in_the_domain(
    compression: str, emulated_device: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A corrupt page refused by the stream check, then named by the host's
    decompression: no byte of the first heap stays charged while the caller
    holds the error; and a valid decode's buffers go back with the result."""
    chunk, spec, page = corrupt_chunk(compression)
    domain = _emulator.Domain()
    logs = caplog.at_level(logging.WARNING, logger="nexus_cache.frames")
    with logs, pytest.raises(SourceFormatError, match=f"byte {page.offset}") as caught:
        _device.decode_chunks_on_device([(chunk, spec, None)], domain)
    assert "failed the stream check" in caplog.text
    assert caught.value.__context__ is not None  # the refusal, kept as the context
    assert domain.used_bytes() == 0
    raw = _write(pa.table({"x": pa.array(np.arange(500) % 91, pa.int64())}))
    good, good_spec = _chunk(raw)
    (got,) = _device.decode_chunks_on_device([(good, good_spec, None)], domain)
    assert domain.used_bytes() > 0
    assert_same(device_piece(got), pq.read_table(io.BytesIO(raw)).column("x").chunk(0), "x")
    del got
    assert domain.used_bytes() == 0


@pytest.mark.parametrize("version", ["1.0", "2.0"])
@pytest.mark.parametrize("kind", [pa.int64(), pa.string()])
def test_a_page_of_nulls_whose_index_bit_width_is_past_32_is_refused(
    version: str, kind: pa.DataType, emulated_device: Any
) -> None:
    """A dictionary-encoded page of nulls only still starts its values with the
    indices' bit width; PyArrow refuses one past 32 though no index follows."""
    table = pa.table({"x": pa.array([None] * 5, kind)})
    out = io.BytesIO()
    pq.write_table(table, out, compression="none", data_page_version=version)
    raw = out.getvalue()
    chunk, spec = _chunk(raw)
    assert_same(decode_chunk(chunk, spec), table.column("x").combine_chunks(), "x")
    assert chunk[-1] == 0  # the data page's last byte: its values, the bit width (0)
    for width in (33, 0x80, 0xFF):
        bad = bytearray(raw)
        bad[spec.start + spec.size - 1] = width
        bad_chunk, _ = _chunk(bytes(bad))
        _pyarrow_refuses(bytes(bad), "bit_width")
        with pytest.raises(SourceFormatError, match=f"bit width {width} is outside"):
            decode_chunk(bad_chunk, spec)
        domain = _emulator.Domain()
        with pytest.raises(SourceFormatError, match=f"bit width {width} is outside"):
            _device.decode_chunks_on_device([(bad_chunk, spec, None)], domain)
        assert domain.used_bytes() == 0
