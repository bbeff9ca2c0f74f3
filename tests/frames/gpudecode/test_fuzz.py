"""Mutated Parquet files against PyArrow: the page decoder never returns a result
where PyArrow refuses the column chunk, never a different one where PyArrow
reads it, and refuses one PyArrow reads only for a documented reason (page
headers that contradict the footer or each other, see docs/frames.md).

Small files of every codec (Brotli's chunks go to the host decoder, which
is PyArrow), both data page versions, dictionary-encoded and PLAIN,
nullable and required columns; one to two bytes of a column chunk changed
(its page headers and pages), from fixed seeds. Each mutated chunk is
decoded by the NumPy reference, and every fifth by the device decoder on
the emulated device (``_emulator``), which must agree with the reference
and leave nothing charged in its domain."""

from __future__ import annotations

import importlib
import io
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.frames.gpudecode import _emulator
from tests.frames.gpudecode._check import assert_same, device_piece

from nexus_cache.errors import FrameTypeError, SourceFormatError
from nexus_cache.frames._host import HostPiece
from nexus_cache.frames.gpudecode import chunk_spec, decode_chunk, read_pages, unsupported_reason

_device = importlib.import_module("nexus_cache.frames.gpudecode.device")

CODECS = ["none", "snappy", "gzip", "zstd", "lz4", "brotli"]
VERSIONS = ["1.0", "2.0"]

#: Refusals of chunks PyArrow reads: page headers that contradict the footer or
#: each other, which PyArrow reads past (docs/frames.md, "What is refused").
DELIBERATE = re.compile(
    "|".join(
        [
            r"unreadable page header",
            r"the pages hold \d+ values, the footer says",
            r"the pages inflate past the \d+ bytes the footer states",
            r"a page of \d+ bytes runs past the column chunk",
            r"an uncompressed page holds \d+ bytes, its header says",
            r"the levels hold \d+ nulls, the header says",
            r"an RLE value \d+ is wider than \d+ bits",
        ]
    )
)


def _table(rng: np.random.Generator, n: int) -> pa.Table:
    nulls = rng.random(n) < 0.3
    schema = pa.schema(
        [
            pa.field("i", pa.int64()),
            pa.field("r", pa.int32(), nullable=False),
            pa.field("s", pa.string()),
            pa.field("b", pa.bool_(), nullable=False),
            pa.field("f", pa.float64()),
        ]
    )
    return pa.table(
        [
            pa.array(rng.integers(0, 5, n), pa.int64(), mask=nulls),
            pa.array(rng.integers(-(1 << 30), 1 << 30, n), pa.int32()),
            pa.array([f"v{k % 7}" for k in rng.integers(0, 50, n)], mask=~nulls),
            pa.array(rng.random(n) < 0.5),
            pa.array(rng.random(n), mask=rng.random(n) < 0.1),
        ],
        schema=schema,
    )


def _file(seed: int, codec: str, version: str) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    pq.write_table(
        _table(rng, int(rng.integers(1, 60))),
        out,
        compression=codec,
        data_page_version=version,
        use_dictionary=bool(seed % 2),
        data_page_size=int(rng.choice([64, 200, 1 << 20])),
    )
    return out.getvalue()


def _pyarrow(raw: bytes, column: str) -> pa.Array | None:
    """PyArrow's read of one column of row group 0, or None where it refuses."""
    try:
        table = pq.ParquetFile(io.BytesIO(raw)).read_row_group(0, columns=[column])
    except (pa.ArrowException, OSError, ValueError):
        return None
    return table.column(0).combine_chunks()


def _ours(decode: Any, chunk: bytes, spec: Any) -> HostPiece | str | None:
    """The decode, the SourceFormatError's text, or None where the chunk is not
    the page decoder's (unsupported: the host decoder, PyArrow, reads it)."""
    try:
        pages = read_pages(chunk, spec)
        if unsupported_reason(spec, pages) is not None:
            return None
        return decode(chunk, spec, pages)
    except FrameTypeError:
        return None
    except SourceFormatError as exc:
        return str(exc)


def _on_emulated_device(chunk: bytes, spec: Any, pages: Any) -> HostPiece:
    domain = _emulator.Domain()
    (got,) = _device.decode_chunks_on_device([(chunk, spec, pages)], domain)
    piece = device_piece(got, spec.arrow_type)
    del got
    assert domain.used_bytes() == 0
    return piece


def _mutate(raw: bytes, start: int, size: int, rng: np.random.Generator) -> bytes:
    data = bytearray(raw)
    for _ in range(int(rng.integers(1, 3))):
        at = start + int(rng.integers(0, size))
        if rng.random() < 0.5:
            data[at] = int(rng.integers(0, 256))
        else:
            data[at] ^= 1 << int(rng.integers(0, 8))
    return bytes(data)


def fuzz(codec: str, version: str, seeds: range, per_chunk: int, device_every: int) -> int:
    """Mutate every column chunk of a file per seed ``per_chunk`` times; returns
    the mutated files checked."""
    checked = 0
    for seed in seeds:
        raw = _file(seed, codec, version)
        pf = pq.ParquetFile(io.BytesIO(raw))
        rng = np.random.default_rng([seed, CODECS.index(codec), VERSIONS.index(version)])
        for j in range(pf.metadata.num_columns):
            spec = chunk_spec(pf, 0, j, "fuzz.parquet")
            for _ in range(per_chunk):
                bad = _mutate(raw, spec.start, spec.size, rng)
                checked += 1
                chunk = bad[spec.start : spec.start + spec.size]
                got = _ours(decode_chunk, chunk, spec)
                if got is None:
                    continue
                where = f"{codec} v{version} seed {seed} column {spec.column}"
                want = _pyarrow(bad, spec.column)
                if want is None:
                    assert isinstance(got, str), f"{where}: PyArrow refuses, we read it"
                elif isinstance(got, str):
                    assert DELIBERATE.search(got), f"{where}: refused ({got}), PyArrow reads it"
                else:
                    assert_same(got, want, where)
                if checked % device_every == 0:
                    on_device = _ours(_on_emulated_device, chunk, spec)
                    if isinstance(got, str):
                        assert isinstance(on_device, str), f"{where}: the device reads it"
                    else:
                        assert isinstance(on_device, HostPiece), f"{where}: {on_device}"
                        assert_same(on_device, want, f"{where} (device)")
    return checked


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("codec", CODECS)
def test_mutated_files_against_pyarrow(codec: str, version: str, emulated_device: Any) -> None:
    """12 x 400 mutated files (4,000 of the page decoder's codecs)."""
    assert fuzz(codec, version, range(40), per_chunk=2, device_every=5) == 400


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("codec", CODECS)
def test_many_more_mutated_files_against_pyarrow(
    codec: str, version: str, emulated_device: Any
) -> None:
    # 2,100 more a case (25,200 in all), on seeds the test above does not use
    assert fuzz(codec, version, range(40, 180), per_chunk=3, device_every=5) == 2100
