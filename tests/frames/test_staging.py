"""Many host pieces to one device buffer (``Transfer.pieces_to_device``): the
image is exact (pieces in place, zeros between), and the copies are one per
pinned slot filled, not one per piece.

The CUDA path's logic runs here on the host: its slots are NumPy arrays and
the CUDA runtime a stand-in whose stream really is asynchronous (a queued
copy runs only when an event recorded after it, or the stream, is waited
for), so a slot refilled before its copy left it shows up as wrong bytes."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from nexus_cache.frames.gpudecode.layout import HeapLayout
from nexus_cache.frames.staging import Transfer, _CudaTransfer


class _Stream:
    """A stream whose work runs when waited for, in order."""

    ptr = 1

    def __init__(self) -> None:
        self.queue: list[Any] = []
        self.done = 0

    def run_to(self, n: int) -> None:
        while self.done < n:
            self.queue[self.done]()
            self.done += 1

    def synchronize(self) -> None:
        self.run_to(len(self.queue))

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _Event:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.stream: _Stream | None = None
        self.mark = 0

    def record(self, stream: _Stream) -> None:
        self.stream, self.mark = stream, len(stream.queue)

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.run_to(self.mark)


def _cuda_transfer(slot_bytes: int, slots: int) -> tuple[_CudaTransfer, list[int]]:
    """A ``_CudaTransfer`` over host slots and the stand-in runtime; the list
    collects the size of every copy queued."""
    stream, copies = _Stream(), []

    def memcpy_async(dst: int, src: int, k: int, kind: int, stream_ptr: int) -> None:
        assert (kind, stream_ptr) == (1, stream.ptr)
        copies.append(k)
        stream.queue.append(lambda: ctypes.memmove(dst, src, k))

    cp = SimpleNamespace(
        cuda=SimpleNamespace(
            Event=_Event,
            runtime=SimpleNamespace(memcpyAsync=memcpy_async, memcpyHostToDevice=1),
        )
    )
    buffers = [np.zeros(slot_bytes, np.uint8) for _ in range(slots)]
    staging = SimpleNamespace(
        cupy=cp,
        slot_bytes=slot_bytes,
        stream=stream,
        events=[_Event() for _ in range(slots)],
        buffers=buffers,
        pointers=[int(b.ctypes.data) for b in buffers],
        release=stream.synchronize,
    )
    domain = SimpleNamespace(host_memory=False)
    return _CudaTransfer(domain, staging, timing=False), copies  # type: ignore[arg-type]


class _Device:
    """Device memory of the stand-in: a host array behind a pointer."""

    def __init__(self, nbytes: int) -> None:
        self.host = np.full(nbytes, 0xEE, np.uint8)  # not zeros: the gaps must be written
        self.data = SimpleNamespace(ptr=int(self.host.ctypes.data))
        self.nbytes = nbytes
        self.flags = self.host.flags


def _layout(seed: int, count: int) -> HeapLayout:
    """Pieces of random sizes (some empty, some larger than a slot) at the heap's
    alignment: a decoder heap's input region."""
    rng = np.random.default_rng(seed)
    layout = HeapLayout()
    for _ in range(count):
        size = int(rng.choice([0, 1, 17, 300, 4095, 4096, 9000]))
        data = rng.integers(0, 256, size + 8, dtype=np.uint8).tobytes()
        layout._put(memoryview(data)[3 : 3 + size])  # views into a larger buffer, as pages are
    return layout


@pytest.mark.parametrize(("seed", "slots"), [(1, 2), (2, 3), (3, 2)])
def test_pinned_pieces_go_in_one_copy_per_slot_and_land_exact(seed: int, slots: int) -> None:
    slot = 4096
    transfer, copies = _cuda_transfer(slot, slots)
    layout = _layout(seed, 60)
    first = np.arange(1000, dtype=np.uint8)
    earlier = _Device(first.nbytes)
    transfer.to_device(first, earlier)  # the first slot is partly used already
    device = _Device(layout.host_size + 64)
    transfer.pieces_to_device(layout.pieces, layout.host_size, device)
    transfer.finish()
    assert device.host[: layout.host_size].tobytes() == layout.host_image().tobytes()
    assert (device.host[layout.host_size :] == 0xEE).all()  # nothing past the image
    assert earlier.host.tobytes() == first.tobytes()
    # one copy per slot the image touches, however many pieces it holds
    assert len(layout.pieces) > 40
    assert len(copies) == 1 + -(-(1000 + layout.host_size) // slot)
    assert sum(copies) == 1000 + layout.host_size
    assert transfer.stats.h2d_copies == len(copies)
    assert transfer.stats.h2d_bytes == 1000 + layout.host_size
    # the slots are reused: a later transfer's bytes follow on
    again = _Device(5000)
    transfer.to_device(np.full(5000, 7, np.uint8), again)
    transfer.finish()
    assert (again.host == 7).all()
    transfer.close()


def test_pieces_out_of_order_or_past_the_image_are_refused() -> None:
    transfer, copies = _cuda_transfer(4096, 2)
    device = _Device(100)
    for pieces, nbytes in [([(10, b"abc"), (11, b"d")], 20), ([(90, b"x" * 20)], 100)]:
        with pytest.raises(ValueError, match="overlaps the one before it"):
            transfer.pieces_to_device(pieces, nbytes, device)
        with pytest.raises(ValueError, match="overlaps the one before it"):
            Transfer(SimpleNamespace()).pieces_to_device(pieces, nbytes, np.zeros(200, np.uint8))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not take"):
        transfer.pieces_to_device([], 101, device)
    assert copies == []  # a refused image sends nothing
    # refused after a slot's copy was queued: that copy is done when it raises
    big = _Device(20_000)
    with pytest.raises(ValueError, match="overlaps the one before it"):
        transfer.pieces_to_device([(0, bytes(9000)), (8000, b"x")], 20_000, big)
    stream = transfer._staging.stream
    assert copies
    assert stream.done == len(stream.queue)
    transfer.close()


def test_host_pieces_are_one_copy_with_zeros_between() -> None:
    layout = _layout(4, 30)
    dst = np.full(layout.host_size + 10, 0xEE, np.uint8)
    transfer = Transfer(SimpleNamespace())  # type: ignore[arg-type]
    transfer.pieces_to_device(layout.pieces, layout.host_size, dst)
    assert dst[: layout.host_size].tobytes() == layout.host_image().tobytes()
    assert (dst[layout.host_size :] == 0xEE).all()
    assert (transfer.stats.h2d_copies, transfer.stats.h2d_bytes) == (1, layout.host_size)
