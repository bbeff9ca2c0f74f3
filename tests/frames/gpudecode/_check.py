"""Decode every column chunk of a Parquet file with the reference decoder and
compare it with PyArrow's decode, bit for bit."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache.frames._host import HostPiece, arrow_array, host_piece
from nexus_cache.frames.gpudecode import (
    ChunkSpec,
    Page,
    chunk_spec,
    decode_chunk,
    read_pages,
    unsupported_reason,
)


def file_chunks(raw: bytes, shift: int = 0) -> list[tuple[bytes, ChunkSpec, Any]]:
    """Every chunk of every row group of the Parquet file ``raw``, row group by
    row group, as (bytes, spec, pages), each as if it lay ``shift`` bytes
    further into the file."""
    pf = pq.ParquetFile(io.BytesIO(raw))
    out = []
    for g in range(pf.metadata.num_row_groups):
        for j in range(pf.metadata.num_columns):
            spec = chunk_spec(pf, g, j, "t.parquet")
            chunk = raw[spec.start : spec.start + spec.size]
            if shift:
                spec = dataclasses.replace(spec, start=spec.start + shift)
            out.append((chunk, spec, read_pages(chunk, spec)))
    return out


def _bits(a: np.ndarray) -> np.ndarray:
    """The raw bytes of each element (so NaN payloads and -0.0 compare exactly)."""
    return np.ascontiguousarray(a).view(np.uint8).reshape(len(a), a.dtype.itemsize)


def device_piece(got: Any, arrow_type: pa.DataType | None = None) -> HostPiece:
    """A decoded :class:`DeviceChunk` (CuPy, or the emulator's arrays) read back;
    the dictionary of a chunk read as ``arrow_type`` (a dictionary type) as an
    Arrow array of its values."""
    dictionary = None
    if getattr(got, "dictionary", None) is not None:
        assert arrow_type is not None, "a dictionary chunk needs its Arrow type"
        d = device_piece(got.dictionary)
        value_type = arrow_type.value_type
        dictionary = arrow_array(value_type, d.length, d.data, d.offsets, d.validity, None)
    return HostPiece(
        got.length,
        got.data.get(),
        None if got.offsets is None else got.offsets.get(),
        None if got.validity is None else got.validity.get(),
        dictionary,
    )


def assert_same(got: HostPiece, expected: pa.Array, where: str) -> None:
    want = host_piece(expected)
    assert got.length == want.length, where
    if want.dictionary is None:
        assert got.dictionary is None, where
    else:
        assert got.dictionary is not None, where
        assert got.dictionary.equals(want.dictionary), where
    if want.validity is None:
        assert got.validity is None, where
        valid = np.ones(want.length, np.bool_)
    else:
        assert got.validity is not None, where
        np.testing.assert_array_equal(got.validity, want.validity, err_msg=where)
        valid = want.validity
    if want.offsets is not None:
        assert got.offsets is not None, where
        assert got.offsets.dtype == want.offsets.dtype, where
        np.testing.assert_array_equal(got.offsets, want.offsets, err_msg=where)
        assert got.data.tobytes() == want.data.tobytes(), where
        return
    assert got.offsets is None, where
    assert got.data.dtype == want.data.dtype, where
    np.testing.assert_array_equal(_bits(got.data[valid]), _bits(want.data[valid]), err_msg=where)


def check_file(
    raw: bytes,
    *,
    expect_supported: bool = True,
    decode: Callable[[bytes, ChunkSpec, list[Page]], HostPiece] = decode_chunk,
    read_dictionary: list[str] | None = None,
) -> dict[str, str]:
    """Compare ``decode`` of every supported chunk of ``raw`` (the columns of
    ``read_dictionary`` read as dictionaries) with PyArrow's decode; returns
    {column: reason} of the others."""
    pf = pq.ParquetFile(io.BytesIO(raw), read_dictionary=read_dictionary)
    reasons: dict[str, str] = {}
    for g in range(pf.metadata.num_row_groups):
        expected = pf.read_row_group(g)
        for j in range(pf.metadata.num_columns):
            spec = chunk_spec(pf, g, j, "generated.parquet")
            chunk = raw[spec.start : spec.start + spec.size]
            pages = read_pages(chunk, spec)
            reason = unsupported_reason(spec, pages)
            if reason is not None:
                assert not expect_supported, f"{spec.column}: {reason}"
                reasons[spec.column] = reason
                continue
            column = expected.column(spec.column).combine_chunks()
            assert_same(decode(chunk, spec, pages), column, f"{spec.column} rg {g}")
    return reasons
