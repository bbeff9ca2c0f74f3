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

from nexus_cache.frames._slots import fill_part, plan_fills
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


def _cuda_transfer(
    slot_bytes: int, slots: int, part_bytes: int = 1 << 30
) -> tuple[_CudaTransfer, list[int]]:
    """A ``_CudaTransfer`` over host slots and the stand-in runtime; the list
    collects the size of every copy queued. A slot's run is written by one
    thread per ``part_bytes`` (the default: one thread)."""
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
    transfer = _CudaTransfer(domain, staging, timing=False, part_bytes=part_bytes)  # type: ignore[arg-type]
    return transfer, copies


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


@pytest.mark.parametrize(
    ("seed", "slots", "part_bytes"),
    [(1, 2, 1 << 30), (2, 3, 1 << 30), (3, 2, 1 << 30), (5, 2, 1000), (6, 3, 512)],
)
def test_pinned_pieces_go_in_one_copy_per_slot_and_land_exact(
    seed: int, slots: int, part_bytes: int
) -> None:
    # part_bytes under the slot size: each slot's run is written by several
    # threads at once, and must land the same
    slot = 4096
    transfer, copies = _cuda_transfer(slot, slots, part_bytes)
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


@pytest.mark.parametrize("part_bytes", [1 << 30, 1024])
def test_pieces_out_of_order_or_past_the_image_are_refused(part_bytes: int) -> None:
    transfer, copies = _cuda_transfer(4096, 2, part_bytes)
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


def _run_plan(
    pieces: list[tuple[int, Any]], nbytes: int, used: int, slot: int, part: int, parts: int
) -> tuple[np.ndarray, list[Any]]:
    """The image a ring of two slots sends when ``plan_fills`` is executed (every
    part written, then each run copied out), and the plan."""
    ring = [np.full(slot, 0xEE, np.uint8) for _ in range(2)]
    image = np.full(nbytes, 0xDD, np.uint8)
    current, fills = 0, list(plan_fills(pieces, nbytes, used, slot, part, parts))
    for i, fill in enumerate(fills):
        assert fill.next_slot == (i > 0 or used >= slot)
        current = (current + fill.next_slot) % 2
        assert fill.slot_at == (0 if fill.next_slot else used)
        assert 0 < fill.size <= slot - fill.slot_at
        # the parts are disjoint, in order, and cover the run exactly
        at = fill.slot_at
        for ops in fill.parts:
            assert ops
            for offset, src, start, k in ops:
                assert (offset, k > 0) == (at, True)
                assert src is None or 0 <= start <= start + k <= memoryview(src).nbytes
                at += k
            fill_part(ring[current], ops)
        assert at == fill.slot_at + fill.size
        end = fill.slot_at + fill.size
        image[fill.image_at : fill.image_at + fill.size] = ring[current][fill.slot_at : end]
    assert sum(f.size for f in fills) == nbytes
    return image, fills


def _pieces(seed: int, slot: int) -> tuple[list[tuple[int, Any]], int]:
    """Random pieces: some empty, some smaller than a slot, some spanning several,
    gaps of zero to two slots between them."""
    rng = np.random.default_rng(seed)
    pieces, at = [], int(rng.integers(0, 2 * slot))
    for _ in range(int(rng.integers(0, 40))):
        size = int(rng.choice([0, 1, 7, slot - 1, slot, slot + 1, 3 * slot + 5]))
        pieces.append((at, rng.integers(0, 256, size, dtype=np.uint8).tobytes()))
        at += size + int(rng.choice([0, 0, 1, 13, slot, 2 * slot]))
    return pieces, at + int(rng.integers(0, 3))


_EDGES = [
    ([], 0),  # empty
    ([(0, b"x")], 1),  # one byte
    ([], 1),  # one zero
    ([(0, bytes(range(256)) * 4)], 1024),  # exactly a slot
    ([(0, bytes(range(256)) * 4)], 1025),  # a slot and a zero
    ([(1023, b"ab")], 1025),  # a piece across a slot boundary
    ([(5, b"")], 10),  # an empty piece
]


@pytest.mark.parametrize("used", [0, 1, 1023, 1024])
@pytest.mark.parametrize(("part", "parts"), [(1 << 20, 4), (100, 1), (100, 3), (1, 4)])
@pytest.mark.parametrize("case", list(range(12)) + [f"edge{i}" for i in range(len(_EDGES))])
def test_slot_plan_writes_the_single_threaded_image(
    case: Any, used: int, part: int, parts: int
) -> None:
    slot = 1024
    if isinstance(case, int):
        pieces, nbytes = _pieces(case, slot)
    else:
        pieces, nbytes = _EDGES[int(case[4:])]
    expected = np.full(nbytes, 0xEE, np.uint8)
    Transfer(SimpleNamespace()).pieces_to_device(pieces, nbytes, expected)  # type: ignore[arg-type]
    image, fills = _run_plan(pieces, nbytes, used, slot, part, parts)
    assert image.tobytes() == expected.tobytes()
    # one run per slot the image touches; a run is cut into parts of at least
    # ``part`` bytes, at most ``parts`` of them
    first = slot - used if used < slot else slot
    assert len(fills) == (0 if nbytes == 0 else 1 + -(-max(0, nbytes - first) // slot))
    for fill in fills:
        assert len(fill.parts) == max(1, min(parts, fill.size // part))


def test_slot_plan_checks_pieces_when_it_reaches_them() -> None:
    # the runs before a malformed piece are planned (and may be sent) first
    plan = plan_fills([(0, bytes(3000)), (2000, b"x")], 5000, 0, 1024, 100, 4)
    assert next(plan).size == 1024
    assert next(plan).size == 1024
    with pytest.raises(ValueError, match="overlaps the one before it"):
        next(plan)
    with pytest.raises(ValueError, match="runs past the image"):
        list(plan_fills([(10, b"abc")], 12, 0, 1024, 100, 4))
    # a malformed piece the image never reaches is refused too, after the runs
    # before it, not dropped
    plan = plan_fills([(0, b"ab"), (1, b"c")], 2, 0, 1024, 100, 4)
    assert next(plan).size == 2
    with pytest.raises(ValueError, match="overlaps the one before it"):
        next(plan)
    with pytest.raises(ValueError, match="runs past the image"):
        list(plan_fills([(0, b"ab"), (2, b"c")], 2, 0, 1024, 100, 4))


def test_small_pieces_and_gaps_are_plain_copies_and_land_exact() -> None:
    # an image of thousands of small pieces (pages) and gaps: each written by
    # a plain buffer copy, without a NumPy call each; large pieces and views
    # of other formats still through NumPy; the bytes as the host joins them
    import sys

    from nexus_cache.frames import _slots

    rng = np.random.default_rng(11)
    file = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    view = memoryview(file)
    pieces: list[tuple[int, Any]] = []
    at = 0
    for i in range(2000):
        size = int(rng.integers(1, 300))
        start = int(rng.integers(0, len(file) - size))
        pieces.append((at, view[start : start + size] if i % 2 else file[start : start + size]))
        at += size + int(rng.integers(0, 16))
    small_end = at
    big = _slots._SMALL_OP + 3
    pieces.append((at, view[:big]))  # a large piece
    at += big + 5
    pieces.append((at, memoryview(bytes(range(16))).cast("I")))  # not a byte view
    nbytes = at + 16 + 7
    expected = np.full(nbytes, 0xEE, np.uint8)
    Transfer(SimpleNamespace()).pieces_to_device(pieces, nbytes, expected)  # type: ignore[arg-type]
    image, _ = _run_plan(pieces, nbytes, 0, 1 << 22, 1 << 30, 1)
    assert image.tobytes() == expected.tobytes()

    (fill,) = plan_fills(pieces[:2000], small_end, 0, 1 << 22, 1 << 30, 1)
    slot = np.zeros(1 << 22, np.uint8)
    numpy_calls = [0]

    def count(frame: Any, event: str, arg: Any) -> None:
        numpy = getattr(arg, "__module__", None) == "numpy"
        if event == "c_call" and (numpy or getattr(arg, "__qualname__", "") == "ndarray.fill"):
            numpy_calls[0] += 1

    sys.setprofile(count)
    try:
        fill_part(slot, fill.parts[0])
    finally:
        sys.setprofile(None)
    assert slot[:small_end].tobytes() == expected[:small_end].tobytes()
    assert numpy_calls[0] == 0, f"{numpy_calls[0]} NumPy calls for 2000 small pieces"


@pytest.mark.parametrize(
    ("slot", "part", "parts"), [(150 << 10, 1 << 30, 1), (1 << 20, 40 << 10, 8)]
)
def test_a_small_write_deep_in_a_long_gap_lands_zeros(slot: int, part: int, parts: int) -> None:
    """A gap longer than a plain copy's zeros (a heap's room for decompressed
    pages), cut by a slot's end or a part's so that a short write starts far
    into it: zeros land there, as the host joins the pieces."""
    from nexus_cache.frames import _slots

    gap = 3 * _slots._SMALL_OP + 123
    pieces: list[tuple[int, Any]] = [(0, b"a" * 10), (10 + gap, b"b" * 10), (30 + gap, b"c")]
    nbytes = 31 + gap + 7
    expected = np.full(nbytes, 0xEE, np.uint8)
    Transfer(SimpleNamespace()).pieces_to_device(pieces, nbytes, expected)  # type: ignore[arg-type]
    image, fills = _run_plan(pieces, nbytes, 0, slot, part, parts)
    assert image.tobytes() == expected.tobytes()
    # the plan does make such a write: fewer bytes than a plain copy's zeros,
    # starting past them
    short = [
        (start, k)
        for fill in fills
        for ops in fill.parts
        for _, src, start, k in ops
        if src is None and k < _slots._SMALL_OP and start + k > _slots._SMALL_OP
    ]
    assert short
