"""The device decoder on the emulated device (``_emulator``): CuPy, the
kernels and nvCOMP replaced by host stand-ins, for tests of the decoder's
orchestration on a machine without a GPU."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from tests.frames.gpudecode import _emulator

from nexus_cache.frames.gpudecode.nvcomp import ALGORITHMS

_heap = importlib.import_module("nexus_cache.frames.gpudecode._heap")


def decompress_like_nvcomp(
    heap: Any, algorithm: str, jobs: Any, where: str, codecs: Any = None
) -> None:
    """nvCOMP's batched decompression of ``jobs`` within ``heap``, by PyArrow."""
    for source, size, out, want in jobs:
        codec = _emulator.PYARROW_CODEC[algorithm]
        got = pa.decompress(bytes(heap[source : source + size]), want, codec=codec)
        heap[out : out + want] = np.frombuffer(got.to_pybytes(), np.uint8)


@pytest.fixture
def emulated_device(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``cupy`` is the emulator's, the kernels its ports (the stream checks
    before nvCOMP included), nvCOMP PyArrow's codecs (with every codec on the
    device); returns the fake ``cupy``."""
    monkeypatch.setitem(sys.modules, "cupy", _emulator.fake_cupy)
    monkeypatch.setattr(_heap, "kernel_function", _emulator.kernel_function)
    monkeypatch.setattr(_heap, "decompress_batch", decompress_like_nvcomp)
    monkeypatch.setattr(_heap, "device_algorithm", ALGORITHMS.get)
    return _emulator.fake_cupy
