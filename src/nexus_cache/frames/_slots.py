"""How an image (host pieces at offsets, zeros between) is cut into the runs of
a ring of pinned staging slots, and each run into parts that threads fill.

Pure host code: :func:`plan_fills` says which bytes of which piece (or which
zeros) go to which offset of which slot; the CUDA transfer
(:mod:`nexus_cache.frames.staging`) executes it, filling one slot's parts on
several threads while the copy engine drains the slot filled before. A slot
holds one run of the image, copied to the device in one copy. The pieces are
checked as they are reached (in increasing order, none past the image), so
the runs before a malformed piece are planned, and may be sent, before it
raises ValueError. Stateless and thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = ["Op", "SlotFill", "fill_part", "image_pieces", "plan_fills"]

#: One write into a slot: ``(slot offset, bytes-like (None: zeros), its first
#: byte to write, count)``.
Op = tuple[int, Any, int, int]


class SlotFill(NamedTuple):
    """One slot's run of the image: bytes ``[image_at, image_at + size)`` of the
    image at ``[slot_at, slot_at + size)`` of the slot, written by ``parts``
    (disjoint ranges of the run, in order, each a list of :data:`Op`).
    ``next_slot``: take the ring's next slot before writing (else the run
    continues the current slot, after the bytes it holds)."""

    next_slot: bool
    slot_at: int
    image_at: int
    size: int
    parts: list[list[Op]]


def image_pieces(
    pieces: Sequence[tuple[int, Any]], nbytes: int
) -> Iterator[tuple[int, np.ndarray]]:
    """Each piece as ``(offset, uint8 array)``, checked to lie in order within
    ``nbytes`` (ValueError when it does not, raised when that piece is reached)."""
    at = 0
    for offset, piece in pieces:
        src = np.frombuffer(piece, np.uint8)
        if offset < at or offset + src.size > nbytes:
            raise _misplaced(src.size, offset, at, nbytes)
        at = offset + src.size
        yield offset, src


class _Segments(NamedTuple):
    """The image as non-empty segments, in order, covering ``[0, limit)``: each
    ``[start, end)`` of the image, and the piece it is (an index of
    ``sources``; -1: zeros, ``sources[-1]`` being None). ``limit``: where the
    first malformed piece (``error``) would begin to be needed, else the
    image's end."""

    start: np.ndarray
    end: np.ndarray
    source: np.ndarray
    sources: list[Any]
    limit: int
    error: ValueError | None


def _segments(pieces: Sequence[tuple[int, Any]], nbytes: int) -> _Segments:
    """The segments of the image (pieces and the zeros between them), found by
    array operations, not a step a piece; a malformed piece (out of order or
    past the image) ends them, its error kept for when the plan reaches it."""
    n = len(pieces)
    sources = [piece for _, piece in pieces]
    offset = np.fromiter((at for at, _ in pieces), np.int64, n)
    size = np.fromiter((memoryview(piece).nbytes for piece in sources), np.int64, n)
    end = offset + size
    before = np.concatenate([[0], end[:-1]])  # where the pieces before each end
    bad = np.flatnonzero((offset < before) | (end > nbytes))
    error = None
    if bad.size:
        k = int(bad[0])
        error = _misplaced(int(size[k]), int(offset[k]), int(before[k]), nbytes)
        n, limit = k, int(before[k])
    else:
        limit = nbytes
    # each piece's gap, then the piece; then the zeros to the end
    starts = np.stack([before[:n], offset[:n]], axis=1).reshape(-1)
    ends = np.stack([offset[:n], end[:n]], axis=1).reshape(-1)
    which = np.stack([np.full(n, -1), np.arange(n)], axis=1).reshape(-1)
    tail = int(end[n - 1]) if n else 0
    if error is None and nbytes > tail:
        starts = np.append(starts, tail)
        ends = np.append(ends, nbytes)
        which = np.append(which, -1)
    keep = ends > starts
    sources.append(None)
    return _Segments(starts[keep], ends[keep], which[keep], sources, limit, error)


def _misplaced(size: int, offset: int, at: int, nbytes: int) -> ValueError:
    return ValueError(
        f"a piece of {size} B at {offset} overlaps the one before it (which ends "
        f"at {at}) or runs past the image's {nbytes} B"
    )


def plan_fills(
    pieces: Sequence[tuple[int, Any]],
    nbytes: int,
    used: int,
    slot_bytes: int,
    part_bytes: int,
    max_parts: int,
) -> Iterator[SlotFill]:
    """The slot runs that write the first ``nbytes`` of the image of ``pieces``
    (``(offset, bytes-like)`` in increasing order, zeros between) into a ring of
    ``slot_bytes`` slots whose current slot holds ``used`` bytes already. A run
    of ``size`` bytes is cut into ``min(max_parts, size // part_bytes)`` parts
    of about equal size (at least one), so a small image is one part a slot.
    Lazy: a run is planned when asked for (each part's writes found by a
    binary search of the image's segments, not a step a piece); a malformed
    piece raises ValueError when the run that needs it is asked for."""
    segments = _segments(pieces, nbytes)
    seg_start, seg_end, sources = segments.start, segments.end, segments.sources
    image_at, slot_at, next_slot = 0, used, used >= slot_bytes
    if next_slot:
        slot_at = 0
    while image_at < nbytes:
        size = min(slot_bytes - slot_at, nbytes - image_at)
        if image_at + size > segments.limit:
            assert segments.error is not None
            raise segments.error
        count = max(1, min(max_parts, size // part_bytes))
        parts: list[list[Op]] = []
        lo = image_at
        for j in range(1, count + 1):
            hi = image_at + size * j // count
            first = int(np.searchsorted(seg_end, lo, "right"))
            last = int(np.searchsorted(seg_start, hi, "left"))
            at = np.maximum(seg_start[first:last], lo)
            stop = np.minimum(seg_end[first:last], hi)
            parts.append(
                list(
                    zip(
                        (at + (slot_at - image_at)).tolist(),
                        map(sources.__getitem__, segments.source[first:last].tolist()),
                        (at - seg_start[first:last]).tolist(),
                        (stop - at).tolist(),
                        strict=True,
                    )
                )
            )
            lo = hi
        yield SlotFill(next_slot, slot_at, image_at, size, parts)
        image_at += size
        slot_at, next_slot = 0, True
    if segments.error is not None:  # a malformed piece past the image's end
        raise segments.error


#: A write of fewer bytes than this is a plain buffer copy (holding the GIL for
#: a few microseconds at most), not a NumPy one, whose setup costs more than
#: such a copy: an image of thousands of pages has thousands of small pieces
#: and gaps. Larger ones go through NumPy, which releases the GIL.
_SMALL_OP = 64 << 10
_ZEROS = memoryview(bytes(_SMALL_OP))


def fill_part(slot: np.ndarray, ops: Sequence[Op]) -> None:
    """Write ``ops`` into ``slot`` (a uint8 array; NumPy's copies release the GIL)."""
    copy, frombuffer, u8 = np.copyto, np.frombuffer, np.uint8
    view, small, zeros = memoryview(slot.data), _SMALL_OP, _ZEROS
    for at, src, start, k in ops:
        if k < small:
            if src is None:  # zeros, wherever in its gap the write starts
                view[at : at + k] = zeros[:k]
                continue
            source = memoryview(src)
            if source.format == "B" and source.ndim == 1:
                view[at : at + k] = source[start : start + k]
                continue
        if src is None:
            slot[at : at + k].fill(0)
        else:
            copy(slot[at : at + k], frombuffer(src, u8, k, start))
