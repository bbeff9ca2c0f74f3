"""The kernels that walk a page or a stream tile by tile (``gpudecode._tile``):
``plain_lengths`` and the two stream checks, on the emulator's ports. Their
results and refusals do not depend on where the tiles fall: pages and
streams larger than a tile, an item straddling a tile's edge, a string
longer than a tile, and the same walks with tiles of a few bytes."""

from __future__ import annotations

import importlib
import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.frames.gpudecode import _emulator
from tests.frames.gpudecode._check import check_file, device_piece
from tests.frames.gpudecode.test_reference import write
from tests.frames.gpudecode.test_stream_check import _TEXT, check_refuses, stream_samples

from nexus_cache.frames._host import HostPiece
from nexus_cache.frames.gpudecode import ChunkSpec, Page, chunk_spec, read_pages
from nexus_cache.frames.gpudecode._tile import TILE_BYTES
from nexus_cache.frames.gpudecode.kernels import BLOCK_KERNELS
from nexus_cache.frames.gpudecode.nvcomp import CODEC_ALGORITHMS

_heap = importlib.import_module("nexus_cache.frames.gpudecode._heap")
_steps = importlib.import_module("nexus_cache.frames.gpudecode._steps")

#: tiles of a few bytes: every prefix and tag straddles some tile's edge
_SMALL_TILES = [1, 3, 5, 64]


def _emulated_decode(chunk: bytes, spec: ChunkSpec, pages: list[Page]) -> HostPiece:
    heap = _heap._Heap(_emulator.fake_cupy, [(chunk, spec, pages)])
    (got,) = _steps.decode_all(heap.chunks)
    return device_piece(got)


@pytest.fixture
def emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_heap, "kernel_function", _emulator.kernel_function)
    monkeypatch.setattr(_heap, "decompress_batch", _emulator.decompress_like_nvcomp)
    monkeypatch.setattr(_heap, "device_algorithm", CODEC_ALGORITHMS.get)


def large_pages_table(n: int = 2500) -> pa.Table:
    """PLAIN string pages of ~100 KB (several tiles each) with one string longer
    than a tile, empty strings and nulls."""
    rng = np.random.default_rng(3)
    values: list[str | None] = [
        f"{i}:" + "x" * int(rng.integers(0, 60)) if i % 11 else None for i in range(n)
    ]
    values[7] = "long" * (TILE_BYTES // 2)  # 2 tiles by itself
    values[8] = ""
    return pa.table({"s": pa.array(values), "i": pa.array(np.arange(n), pa.int64())})


def large_pages_file(compression: str) -> bytes:
    raw = write(
        large_pages_table(),
        compression=compression,
        use_dictionary=False,
        data_page_size=100_000,
    )
    pf = pq.ParquetFile(io.BytesIO(raw))
    spec = chunk_spec(pf, 0, 0, "t.parquet")
    pages = read_pages(raw[spec.start : spec.start + spec.size], spec)
    assert max(p.header.uncompressed_size for p in pages) > 4 * TILE_BYTES
    return raw


@pytest.mark.parametrize("compression", ["none", "snappy", "lz4"])
def test_pages_larger_than_a_tile_equal_pyarrow(emulated: None, compression: str) -> None:
    raw = large_pages_file(compression)
    check_file(raw, decode=_emulated_decode)


@pytest.mark.parametrize("tile", _SMALL_TILES)
def test_small_tiles_give_the_same_pages(
    emulated: None, monkeypatch: pytest.MonkeyPatch, tile: int
) -> None:
    monkeypatch.setattr(_emulator, "TILE_BYTES", tile)
    raw = write(large_pages_table(300), compression="snappy", use_dictionary=False)
    check_file(raw, decode=_emulated_decode)


def _plain_lengths(page: bytes, count: int) -> tuple[int, list[int], list[int]]:
    """``plain_lengths`` over one page that fills its heap: (error, starts, lengths)."""
    cp = _emulator.fake_cupy
    heap = cp.asarray(np.frombuffer(page, np.uint8))
    starts, lengths = cp.zeros(count, np.int64), cp.zeros(count, np.int64)
    error = cp.zeros(1, np.int32)

    def one(v: int) -> Any:
        return cp.asarray(np.array([v], np.int64))

    args = (heap, one(0), one(len(page)), one(0), one(count), starts, lengths, error, np.int32(1))
    _emulator.kernel_function("plain_lengths")((1,), (256,), args)
    return int(error[0]), starts.tolist(), lengths.tolist()


def _prefixed(strings: list[bytes]) -> bytes:
    return b"".join(len(s).to_bytes(4, "little") + s for s in strings)


@pytest.mark.parametrize("tile", [TILE_BYTES, *_SMALL_TILES])
def test_a_length_past_the_page_end_in_a_later_tile_is_refused(
    monkeypatch: pytest.MonkeyPatch, tile: int
) -> None:
    """Two tiles of good strings, then a prefix whose length points one byte past
    the page's end: the error flag, and the strings before it as the serial walk
    wrote them; the same page one string shorter is read whole."""
    monkeypatch.setattr(_emulator, "TILE_BYTES", tile)
    strings = [b"%d" % i * (i % 9) for i in range(TILE_BYTES // 5)]
    good = _prefixed(strings)
    assert len(good) > 2 * TILE_BYTES
    error, starts, lengths = _plain_lengths(good, len(strings))
    assert error == 0
    assert lengths == [len(s) for s in strings]
    assert starts[-1] + lengths[-1] == len(good)
    bad = good + (5).to_bytes(4, "little") + b"abcd"  # 5 bytes said, 4 there
    error, starts, got = _plain_lengths(bad, len(strings) + 1)
    assert error == 1
    assert got[:-1] == lengths
    assert got[-1] == 0
    # a prefix cut short by the page's end, and more values than the page holds
    assert _plain_lengths(good + b"\x01\x00", len(strings) + 1)[0] == 1
    assert _plain_lengths(good, len(strings) + 1)[0] == 1
    assert _plain_lengths(b"", 0) == (0, [], [])


@pytest.mark.parametrize("codec", ["snappy", "lz4_raw"])
@pytest.mark.parametrize("tile", _SMALL_TILES)
def test_the_check_refuses_the_same_streams_with_small_tiles(
    monkeypatch: pytest.MonkeyPatch, codec: str, tile: int
) -> None:
    cases: list[tuple[bytes, int]] = []
    for data in [s for s in stream_samples() if len(s) <= 1000] + [_TEXT[:600]]:
        packed = pa.Codec(codec).compress(data, asbytes=True)
        cases += [(packed, len(data)), (packed, len(data) + 1)]
        cases += [(packed[:cut], len(data)) for cut in range(0, len(packed), 7)]
        if len(packed) > 40:
            bad = bytearray(packed)
            bad[8:40] = bytes(range(200, 232))
            cases.append((bytes(bad), len(data)))
    expected = [check_refuses(codec, s, n) for s, n in cases]
    monkeypatch.setattr(_emulator, "TILE_BYTES", tile)
    assert [check_refuses(codec, s, n) for s, n in cases] == expected
    assert 0 < sum(expected) < len(expected)


@pytest.mark.parametrize("codec", ["snappy", "lz4_raw"])
def test_garbage_in_a_later_tile_is_refused(codec: str) -> None:
    data = b"".join(b"row %d, value %d; " % (i, i * 7919 % 1013) for i in range(20_000))
    stream = pa.Codec(codec).compress(data, asbytes=True)
    assert len(stream) > 3 * TILE_BYTES
    assert not check_refuses(codec, stream, len(data))
    bad = bytearray(stream)
    at = 2 * TILE_BYTES + 100
    bad[at : at + 32] = bytes(range(200, 232))
    assert check_refuses(codec, bytes(bad), len(data))
    assert check_refuses(codec, stream[: 2 * TILE_BYTES + 3], len(data))


def test_the_walking_kernels_get_one_block_per_item(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_launch``: one block of 128 threads per page or section for the kernels
    that walk one tile by tile (more such blocks fit an SM than of 256), one
    thread per item for the others."""
    grids: dict[str, tuple[int, int]] = {}

    def record(name: str, element_bytes: int | None = None) -> Any:
        def launch(grid: Any, block: Any, args: Any) -> None:
            grids[name] = (grid[0], block[0])

        return launch

    monkeypatch.setattr(_heap, "kernel_function", record)
    for name in (*BLOCK_KERNELS, "hybrid_runs"):
        _heap._launch(name, None, 600, ())
    assert {name: grids[name] for name in BLOCK_KERNELS} == dict.fromkeys(
        BLOCK_KERNELS, (600, 128)
    )
    assert grids["hybrid_runs"] == (3, 256)
