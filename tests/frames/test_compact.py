"""The kept rows of several masks with one read back (``frames.compact``): the
device flow run on the host with the kernel's NumPy port, and the kernel
compiled by NVRTC. (On a GPU: tests/gpu/test_tables_gpu.py.)"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from tests.frames.gpudecode import _emulator

from nexus_cache.frames.compact import COMPACT_SOURCE, kept_rows

_compact = importlib.import_module("nexus_cache.frames.compact")

#: the CuPy calls the flow makes, on the emulator's arrays (whose ``get`` is counted)
_xp = SimpleNamespace(
    cumsum=lambda a, dtype=None: _emulator._wrap(np.cumsum(a, dtype=dtype)),
    concatenate=lambda arrays: _emulator._wrap(np.concatenate(arrays)),
    empty=lambda n, dtype: _emulator._wrap(np.full(n, -1, dtype)),
)


def _port(mask: Any, position: Any, out: Any) -> None:
    """``compact_rows``, thread for thread: row i, where kept, to its place."""
    for i in range(mask.size):
        if mask[i]:
            out[position[i] - 1] = i


def _masks(seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    return [
        None,  # a frame whose every row is kept
        rng.random(1000) < 0.3,
        np.zeros(0, bool),  # a frame of no rows
        np.zeros(50, bool),
        np.ones(17, bool),
        None,
        rng.random(5) < 0.5,
    ]


@pytest.mark.parametrize("seed", range(5))
def test_the_device_flow_gives_each_masks_rows_with_one_read_back(seed: int) -> None:
    masks = _masks(seed)
    before = _emulator.READS[0]
    got = _compact._kept_rows(masks, _xp, _port)
    assert _emulator.READS[0] - before == 1  # one wait for the device, whatever the masks
    assert len(got) == len(masks)
    for mask, rows in zip(masks, got, strict=True):
        if mask is None:
            assert rows is None
        else:
            np.testing.assert_array_equal(np.asarray(rows), np.flatnonzero(mask))
            assert rows.dtype == np.int64


def test_nothing_to_count_reads_nothing_back() -> None:
    before = _emulator.READS[0]
    assert _compact._kept_rows([None, np.zeros(0, bool)], _xp, _port)[0] is None
    assert _emulator.READS[0] == before


def test_on_the_host_the_rows_are_numpys() -> None:
    masks = _masks(1)
    for mask, rows in zip(masks, kept_rows(masks, np), strict=True):
        if mask is None:
            assert rows is None
        else:
            np.testing.assert_array_equal(rows, np.flatnonzero(mask))


def test_the_kernel_compiles() -> None:
    pytest.importorskip("cuda.core")
    from nexus_cache._kernel_loader import compile_cubin

    cubin, _ = compile_cubin(COMPACT_SOURCE, "compact_rows", "sm_90")
    assert cubin
