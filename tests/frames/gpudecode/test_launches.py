"""Launches of the page-decode kernels as the GPU needs them: the emulator's
launch checks refuse what a GPU would misread or fault on, and the device
decoder's launches pass them, a capped grid included."""

from __future__ import annotations

import importlib
import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.frames.gpudecode import _emulator
from tests.frames.gpudecode._check import assert_same, device_piece
from tests.frames.gpudecode._emulator import LaunchError, fake_cupy, signature
from tests.frames.gpudecode.test_reference import write

from nexus_cache.frames.gpudecode import chunk_spec, read_pages
from nexus_cache.frames.gpudecode.kernels import KERNEL_NAMES, TYPED_KERNELS

_heap = importlib.import_module("nexus_cache.frames.gpudecode._heap")
_steps = importlib.import_module("nexus_cache.frames.gpudecode._steps")


def _positions(start: int, stop: int) -> Any:
    return fake_cupy.asarray(np.arange(start, stop, dtype=np.int64))


def _scatter_args(**change: Any) -> list[Any]:
    args = {
        "valid": fake_cupy.ones(4, np.uint8),
        "position": fake_cupy.asarray(np.arange(4, dtype=np.int64)),
        "dense": fake_cupy.zeros(4, np.int64),
        "out": fake_cupy.zeros(4, np.int64),
        "n": np.int64(4),
    }
    args.update(change)
    return list(args.values())


def _scatter(*args: Any, grid: Any = (1,), block: Any = (256,)) -> None:
    _emulator.kernel_function("scatter_values", 8)(grid, block, tuple(args))


def test_a_good_launch_runs() -> None:
    args = _scatter_args(dense=fake_cupy.asarray(np.array([5, 6, 7, 8], np.int64)))
    _scatter(*args)
    assert args[3].tolist() == [5, 6, 7, 8]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"position": fake_cupy.asarray(np.arange(4, dtype=np.int32))}, "got int32"),
        ({"dense": fake_cupy.zeros(4, np.int32)}, "int32 for 8-byte elements"),
        ({"n": 4}, "got int, not int64"),
        ({"n": np.int32(4)}, "got int32, not int64"),
        ({"valid": np.ones(4, np.uint8)}, "not a contiguous 1-d device array"),
        ({"out": fake_cupy.zeros(8, np.int64)[::2]}, "not a contiguous 1-d device array"),
        # position 4 of a 4-value dense array: out of bounds on the GPU
        ({"position": _positions(1, 5)}, "index 4 of a 4-item"),
        # position -1 (NumPy would take the last value)
        ({"position": _positions(-1, 3)}, "index -1 of a 4-item"),
    ],
)
def test_a_launch_a_gpu_would_misread_is_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        _scatter(*_scatter_args(**change))


@pytest.mark.parametrize(
    ("grid", "block"), [((0,), (256,)), ((1 << 31,), (256,)), ((1,), (2048,)), ((1.0,), (256,))]
)
def test_an_unlaunchable_grid_is_refused(grid: Any, block: Any) -> None:
    with pytest.raises(LaunchError):
        _scatter(*_scatter_args(), grid=grid, block=block)


def test_a_write_through_a_const_pointer_is_refused() -> None:
    def writes_its_input(valid: Any, position: Any, dense: Any, out: Any, n: Any) -> None:
        valid[0] = 0

    original = _emulator.KERNELS["scatter_values"]
    _emulator.KERNELS["scatter_values"] = writes_its_input
    try:
        with pytest.raises(ValueError, match="read-only"):
            _scatter(*_scatter_args())
    finally:
        _emulator.KERNELS["scatter_values"] = original


def test_every_kernel_signature_is_read() -> None:
    for name in KERNEL_NAMES:
        params = signature(name, 8 if name in TYPED_KERNELS else None)
        assert params[-1][1] is False  # the last: a scalar item count
        assert all(ctype in (*_emulator._C_TYPES, "ELEM_T") for ctype, _, _ in params)


def many_pages_file(compression: str) -> bytes:
    """Each string and dictionary-encoded chunk of more than 300 pages, with nulls."""
    n = 3000
    rng = np.random.default_rng(7)
    mask = rng.random(n) < 0.2
    table = pa.table(
        {
            "s": pa.array([f"v{i}" for i in range(n)], mask=mask),
            "i": pa.array(rng.integers(0, 9, n), pa.int64(), mask=mask),
            "b": pa.array(rng.random(n) < 0.5, mask=mask),
        }
    )
    options = {"data_page_size": 16, "write_batch_size": 8, "compression": compression}
    return write(table, use_dictionary=["i"], **options)


def test_a_capped_grid_still_covers_every_page_and_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch caps its grid (``_MAX_BLOCKS``): a kernel with one thread per
    page or stream must loop over the rest, not skip them. With one block of
    256 threads, a chunk of more than 256 pages decodes whole."""
    monkeypatch.setattr(_heap, "kernel_function", _emulator.kernel_function)
    monkeypatch.setattr(_heap, "device_algorithm", lambda codec: None)
    monkeypatch.setattr(_heap, "_MAX_BLOCKS", 1)
    raw = many_pages_file("none")
    pf = pq.ParquetFile(io.BytesIO(raw))
    items = []
    for j in range(pf.metadata.num_columns):
        spec = chunk_spec(pf, 0, j, "t.parquet")
        chunk = raw[spec.start : spec.start + spec.size]
        items.append((chunk, spec, read_pages(chunk, spec)))
    assert [len(pages) > 300 for _, _, pages in items] == [True, True, False]
    heap = _heap._Heap(fake_cupy, items)
    got = _steps.decode_all(heap.chunks)
    expected = pf.read_row_group(0)
    for (_, spec, _), piece in zip(items, got, strict=True):
        assert_same(
            device_piece(piece), expected.column(spec.column).combine_chunks(), spec.column
        )
