"""Heaps in flight: the GPU engine cuts a read into heaps of even size and
decodes two at once, each on a transfer of its own (the caller's, and a
sibling of it), so that one heap's host work overlaps the other's device
work. On the emulated device: the results, the lanes, the cut, and what an
error or an interrupt in one heap leaves behind."""

from __future__ import annotations

import gc
import importlib
import io
import threading
from types import SimpleNamespace
from typing import Any

import pyarrow.parquet as pq
import pytest
from tests.frames.gpudecode import _emulator
from tests.frames.gpudecode.test_batching import _plan, _table, _to_table, _Transfer
from tests.frames.gpudecode.test_reference import write

from nexus_cache.errors import SourceFormatError

_engine = importlib.import_module("nexus_cache.frames._page_engine")


def _groups(*sizes: int) -> list[list[Any]]:
    """Row groups of one chunk each, ``size`` bytes stored and decompressed
    (a heap takes twice ``size``)."""
    return [[(None, SimpleNamespace(size=s, uncompressed_size=s), [])] for s in sizes]


@pytest.mark.parametrize(
    ("in_flight", "budget", "least", "want"),
    [
        (2, 10_000, 100, [2, 2, 2, 2]),  # 1600 bytes in about four even heaps
        (2, 10_000, 1000, [8]),  # under two heaps' worth of the least: one heap
        (2, 600, 100, [1, 1, 1, 1, 1, 1, 1, 1]),  # each heap at most 600 / 2 bytes
        (1, 10_000, 100, [8]),  # one heap at a time: as large as the budget takes
        (1, 700, 100, [3, 3, 2]),
    ],
)
def test_a_read_is_cut_into_even_heaps_within_the_budget(
    in_flight: int, budget: int, least: int, want: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_engine, "PIPELINE_HEAPS", 4)
    monkeypatch.setattr(_engine, "MIN_PIPELINED_BYTES", least)
    got = _engine._pipelined_batches(_groups(*[100] * 8), budget, in_flight)
    assert [len(b) for b in got] == want
    assert [g for b in got for g in b] == _groups(*[100] * 8)  # every row group once, in order


class _Counted:
    """The device decoder, recording each heap's transfer; ``meet``: the first
    two heaps each wait until the other has started (a test that they run at
    once); ``fail_at``: the heap (by call) that raises ``error`` instead."""

    def __init__(self, meet: bool = False, fail_at: int = -1, error: Any = None) -> None:
        self.real = _engine.decode_chunks_on_device
        self.transfers: list[Any] = []
        self.barrier = threading.Barrier(2, timeout=10) if meet else None
        self.fail_at, self.error = fail_at, error
        self.lock = threading.Lock()

    def __call__(self, items: Any, domain: Any, transfer: Any, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            call = len(self.transfers)
            self.transfers.append(transfer)
        if self.barrier is not None and call < 2:
            self.barrier.wait()
        if call == self.fail_at:
            raise self.error
        return self.real(items, domain, transfer, *args, **kwargs)


def _decode(raw: bytes, counted: _Counted, transfer: Any, domain: Any) -> Any:
    plan, schema = _plan(raw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_engine, "decode_chunks_on_device", counted)
        mp.setattr(_engine, "MIN_PIPELINED_BYTES", 1)
        mp.setattr(_engine, "PIPELINE_HEAPS", 4)
        mp.setattr(_engine, "HEAPS_IN_FLIGHT", 2)
        return _engine.decode_page_columns(plan, schema, domain, transfer=transfer), schema


class _Closing(_Transfer):
    """A recording transfer whose siblings say when they are closed."""

    def __init__(self, closed: list[int] | None = None) -> None:
        super().__init__()
        self.closed = [] if closed is None else closed

    def sibling(self) -> _Closing:
        twin = _Closing(self.closed)
        twin.images = self.images
        return twin

    def close(self) -> None:
        self.closed.append(id(self))


@pytest.mark.usefixtures("emulated_device")
def test_two_heaps_decode_at_once_on_their_own_transfers() -> None:
    raw = write(_table(), row_group_size=500, compression="snappy")  # 8 row groups
    transfer, domain = _Closing(), _emulator.Domain()
    counted = _Counted(meet=True)
    columns, schema = _decode(raw, counted, transfer, domain)
    arrays = [
        SimpleNamespace(
            field=f,
            length=c.length,
            data=c.data.get(),
            offsets=None if c.offsets is None else c.offsets.get(),
            validity=None if c.validity is None else c.validity.get(),
        )
        for f, c in ((f, columns[f.name]) for f in schema)
    ]
    assert _to_table(arrays).equals(pq.read_table(io.BytesIO(raw)))
    assert len(counted.transfers) == 4  # four heaps of two row groups
    lanes = {id(t) for t in counted.transfers}
    assert len(lanes) == 2  # the caller's and one sibling
    assert id(transfer) in lanes
    # the sibling's copies are counted on the caller's transfer, and it is given back
    assert transfer.stats.h2d_copies == len(transfer.images) == 4
    assert transfer.closed == [id(t) for t in counted.transfers if t is not transfer][:1]
    del columns, arrays
    gc.collect()
    assert domain.used_bytes() == 0


@pytest.mark.usefixtures("emulated_device")
@pytest.mark.parametrize(
    "error", [SourceFormatError("a corrupt page"), KeyboardInterrupt()], ids=["corrupt", "ctrl-c"]
)
def test_an_error_in_one_heap_leaves_no_heap_running_and_nothing_kept(error: Any) -> None:
    raw = write(_table(), row_group_size=500, compression="snappy")
    transfer, domain = _Closing(), _emulator.Domain()
    counted = _Counted(fail_at=1, error=error)
    with pytest.raises(type(error)):
        _decode(raw, counted, transfer, domain)
    assert not [t for t in threading.enumerate() if t.name.startswith("nexus-gpu-heap")]
    assert len(transfer.closed) == 1  # the sibling was given back
    gc.collect()
    assert domain.used_bytes() == 0  # no heap's buffers, no finished heap's results
