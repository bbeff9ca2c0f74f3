"""Parquet's RLE / bit-packed hybrid encoding, decoded the way the kernels do.

Two steps, one-to-one with the CUDA kernels ``hybrid_runs`` and
``hybrid_expand`` (:mod:`.kernels`):

1. :func:`hybrid_runs` walks the run headers of one stream serially (one
   GPU thread per stream) into a run table: for each run, the first output
   index, whether it is bit-packed, and its repeated value (RLE) or the
   byte where its packed bits start;
2. :func:`hybrid_expand` computes every output value independently (one GPU
   thread per value): find the value's run by binary search of the run
   starts, then either take the run's value or read ``bit_width`` bits at
   ``packed_byte * 8 + (i - run_start) * bit_width``, least significant bit
   first.

PLAIN booleans are one bit-packed run of width 1, so they use step 2 alone.
Bounded: a stream yields at most ``count`` values and at most one run per
byte it holds. Refused as PyArrow refuses them (:class:`HybridError`): a
stream that ends before ``count`` values, a run header past 32 bits, a run
of no values, and a bit-packed run whose declared values run past the end
of the stream (only its last group of 8 may be cut short). Pure NumPy,
thread-safe.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["HybridError", "RunTable", "hybrid_expand", "hybrid_runs", "packed_run"]

MAX_BIT_WIDTH = 32
#: the most groups of 8 values one bit-packed run may declare (its values fit an int32)
_MAX_GROUPS = ((1 << 31) - 1) // 8


class HybridError(ValueError):
    """The stream is malformed (truncated, or its bit width is out of range)."""


class RunTable(NamedTuple):
    """Runs of one stream. ``starts``: first output index of each run (int64,
    ascending, starting at 0); ``packed``: bit-packed (True) or RLE;
    ``values``: the RLE value, or the packed run's first byte in the stream."""

    starts: np.ndarray
    packed: np.ndarray
    values: np.ndarray
    length: int
    bit_width: int


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise HybridError("a run header runs past the end of the stream")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift >= 35:  # run headers are 32-bit
            raise HybridError("a run header is longer than 5 bytes")


def hybrid_runs(stream: memoryview | bytes, bit_width: int, count: int) -> RunTable:
    """The run table of the first ``count`` values of ``stream`` (see module doc)."""
    if not 0 <= bit_width <= MAX_BIT_WIDTH:
        raise HybridError(f"bit width {bit_width} is outside 0..{MAX_BIT_WIDTH}")
    buf = memoryview(stream).cast("B")
    value_bytes = (bit_width + 7) // 8
    starts: list[int] = []
    packed: list[bool] = []
    values: list[int] = []
    pos = done = 0
    while done < count:
        header, pos = _varint(buf, pos)
        if header >> 32:
            raise HybridError("a run header is wider than 32 bits")
        if header & 1:  # bit-packed: header >> 1 groups of 8 values
            groups = header >> 1
            if not groups or groups > _MAX_GROUPS:
                raise HybridError(f"a bit-packed run of {groups} groups of 8 values")
            length, size = groups * 8, groups * bit_width
            if size > len(buf) - pos:
                # only the last group may be cut short (some writers do)
                size = len(buf) - pos
                length = size * 8 // bit_width
                if length <= (groups - 1) * 8:
                    raise HybridError(
                        f"a bit-packed run of {groups * 8} values runs past the end of the stream"
                    )
            take = min(length, count - done)
            if take:
                starts.append(done)
                packed.append(True)
                values.append(pos)
            pos += size
        else:  # RLE: header >> 1 repeats of one little-endian value
            length = header >> 1
            if not length:
                raise HybridError("an RLE run of no values")
            take = min(length, count - done)
            if pos + value_bytes > len(buf):
                raise HybridError("an RLE run's value runs past the end of the stream")
            value = int.from_bytes(buf[pos : pos + value_bytes], "little")
            if value >> bit_width:
                raise HybridError(f"an RLE value {value} is wider than {bit_width} bits")
            if take:
                starts.append(done)
                packed.append(False)
                values.append(value)
            pos += value_bytes
        done += take
    return RunTable(
        np.array(starts, np.int64),
        np.array(packed, np.bool_),
        np.array(values, np.int64),
        count,
        bit_width,
    )


def packed_run(count: int, bit_width: int = 1) -> RunTable:
    """The table of a stream that is one bit-packed run from byte 0 (PLAIN booleans)."""
    return RunTable(
        np.zeros(1 if count else 0, np.int64),
        np.ones(1 if count else 0, np.bool_),
        np.zeros(1 if count else 0, np.int64),
        count,
        bit_width,
    )


def hybrid_expand(stream: memoryview | bytes, runs: RunTable) -> np.ndarray:
    """The ``runs.length`` values (uint32) of ``stream``, each computed on its own."""
    n, width = runs.length, runs.bit_width
    if n == 0:
        return np.zeros(0, np.uint32)
    i = np.arange(n, dtype=np.int64)
    run = np.searchsorted(runs.starts, i, side="right") - 1
    out = runs.values[run].astype(np.uint64)  # the RLE values; packed ones replaced below
    packed = runs.packed[run]
    if packed.any() and width:
        # Read 8 bytes at the value's first byte (the stream padded with zeros,
        # as the kernel bounds its reads), shift and mask: one value each.
        raw = np.frombuffer(bytes(stream), np.uint8)
        padded = np.concatenate([raw, np.zeros(8, np.uint8)])
        bit = runs.values[run[packed]] * 8 + (i[packed] - runs.starts[run[packed]]) * width
        byte = bit >> 3
        window = np.zeros(len(byte), np.uint64)
        for k in range(8):
            window |= padded[byte + k].astype(np.uint64) << np.uint64(8 * k)
        mask = np.uint64((1 << width) - 1)
        out[packed] = (window >> (bit & 7).astype(np.uint64)) & mask
    elif packed.any():
        out[packed] = 0
    return out.astype(np.uint32)
