"""The device decoder on the emulated device (``_emulator``): CuPy, the
kernels and nvCOMP replaced by host stand-ins, for tests of the decoder's
orchestration on a machine without a GPU."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import pytest
from tests.frames.gpudecode import _emulator

from nexus_cache.frames.gpudecode.nvcomp import CODEC_ALGORITHMS

_heap = importlib.import_module("nexus_cache.frames.gpudecode._heap")


@pytest.fixture
def emulated_device(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``cupy`` is the emulator's, the kernels its ports (the stream checks
    before nvCOMP included), nvCOMP PyArrow's codecs (with every codec on the
    device); returns the fake ``cupy``."""
    monkeypatch.setitem(sys.modules, "cupy", _emulator.fake_cupy)
    monkeypatch.setattr(_heap, "kernel_function", _emulator.kernel_function)
    monkeypatch.setattr(_heap, "decompress_batch", _emulator.decompress_like_nvcomp)
    monkeypatch.setattr(_heap, "device_algorithm", CODEC_ALGORITHMS.get)
    return _emulator.fake_cupy
