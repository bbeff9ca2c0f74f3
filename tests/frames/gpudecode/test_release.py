"""The device decoder gives its heap and temporaries back when it returns or
raises, by reference counting alone: nothing of it waits for the garbage
collector (on a GPU, bytes still live in the attempt's domain until a
collection ran). Driven on the emulated device (``_emulator``)."""

from __future__ import annotations

import gc
import importlib
import io
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.frames.gpudecode import _emulator
from tests.frames.gpudecode.test_reference import write

from nexus_cache.errors import SourceFormatError
from nexus_cache.frames.gpudecode import chunk_spec, read_pages

_heap = importlib.import_module("nexus_cache.frames.gpudecode._heap")
_device = importlib.import_module("nexus_cache.frames.gpudecode.device")


@pytest.fixture
def heaps(emulated_device: Any, monkeypatch: pytest.MonkeyPatch) -> list[weakref.ref[Any]]:
    """The device decoder on the emulated device; returns weak references to
    every heap buffer it makes."""
    made: list[weakref.ref[Any]] = []

    class _Watched(_heap._Heap):
        def _fill(self, *args: Any, **kwargs: Any) -> Any:
            layout = super()._fill(*args, **kwargs)
            made.append(weakref.ref(self.data))
            return layout

    monkeypatch.setattr(_device, "_Heap", _Watched)
    return made


@pytest.fixture
def no_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _items(raw: bytes) -> list[tuple[bytes, Any, Any]]:
    pf = pq.ParquetFile(io.BytesIO(raw))
    out = []
    for j in range(pf.metadata.num_columns):
        spec = chunk_spec(pf, 0, j, "t.parquet")
        out.append((raw[spec.start : spec.start + spec.size], spec, None))
    return out


def _table() -> pa.Table:
    n = 2000
    return pa.table(
        {
            "i": pa.array(np.arange(n) % 17, pa.int64(), mask=np.arange(n) % 5 == 0),
            "s": pa.array([f"v{i % 23}" for i in range(n)]),
        }
    )


@pytest.mark.usefixtures("no_collector")
def test_the_heap_goes_back_when_the_decode_returns(heaps: list[weakref.ref[Any]]) -> None:
    out = _device.decode_chunks_on_device(
        _items(write(_table(), compression="snappy")), _emulator.Domain()
    )
    assert len(out) == 2
    assert heaps
    assert all(ref() is None for ref in heaps)


@pytest.mark.usefixtures("no_collector")
def test_the_heap_goes_back_while_the_caller_holds_the_error(
    heaps: list[weakref.ref[Any]],
) -> None:
    raw = write(pa.table({"x": pa.array([1, 2, 1, 2] * 10, pa.int64())}), compression="none")
    ((chunk, spec, _),) = _items(raw)
    data = bytearray(chunk)
    _, page = read_pages(chunk, spec)
    at = len(data) - len(page.payload)
    levels = int.from_bytes(data[at : at + 4], "little")
    data[at + 4 + levels] = 8  # index bit width 8 for a 2-entry dictionary
    with pytest.raises(SourceFormatError) as caught:
        _device.decode_chunks_on_device([(bytes(data), spec, None)], _emulator.Domain())
    assert caught.value.__traceback__ is not None  # the caller still holds it
    assert heaps
    assert all(ref() is None for ref in heaps)
