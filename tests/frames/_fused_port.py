"""NumPy ports of ``frames.fused_filter``'s kernels, to run its flows on the host.

Each port reads the packed table exactly as its kernel does (the header, the
object records, the chunk starts, the instruction table, the constants) and
reaches the columns through the addresses the flow wrote there: the port's
:meth:`PortKernels.address` records each array it is asked for, and a port
dereferences an address only through that record (an address the flow never
took is a :class:`~tests.frames.gpudecode._emulator.LaunchError`; a row past
an array's end an ``IndexError``). A port runs one chunk (the kernel's block)
at a time, vectorised over the chunk's rows, in the kernel's order.
``launches`` counts each kernel's launches; the emulated CuPy of
``tests.frames.gpudecode._emulator`` counts the reads back, and
:data:`UPLOADS` the uploads.
"""

from __future__ import annotations

import collections
import weakref
from types import SimpleNamespace
from typing import Any

import numpy as np
from tests.frames.gpudecode import _emulator

from nexus_cache.frames._filter_program import LOADS

#: uploads of host arrays to the "device" (each ``asarray``: one copy)
UPLOADS = [0]


def _upload(a: Any) -> Any:
    UPLOADS[0] += 1
    return _emulator._wrap(np.array(a))


#: the emulated CuPy, its uploads counted
xp = SimpleNamespace(**{**vars(_emulator.fake_cupy), "asarray": _upload})


class Domain(_emulator.Domain):
    """The emulated device domain, its new buffers filled with a byte no kernel
    writes (a row the gather misses shows)."""

    xp = xp

    def empty(self, n: int, dtype: Any) -> Any:
        out = _emulator._wrap(np.zeros(n, dtype))
        out.view(np.uint8)[...] = 0xA5
        return out


_OBJECT, _INSTRUCTION = 6, 8
_EQ, _NE, _LT, _LE, _GT, _GE, _IN, _NOT_IN, _TRUE = range(9)
_CLASS = (np.dtype(np.int64), np.dtype(np.uint64), np.dtype(np.float64))


class PortKernels:
    """The three kernels as NumPy ports, with the address record they read through."""

    def __init__(self) -> None:
        #: each address handed out and its array, weakly held (as an address holds no
        #: device memory)
        self.memory: dict[int, weakref.ref[Any]] = {}
        self.launches: collections.Counter[str] = collections.Counter()

    def address(self, array: Any) -> int:
        base = np.asarray(array)
        at = int(base.__array_interface__["data"][0])
        assert base.ndim == 1
        assert base.flags.c_contiguous
        self.memory[at] = weakref.ref(array)
        return at

    def _at(self, address: int, dtype: Any) -> np.ndarray:
        array = self.memory[int(address)]() if int(address) in self.memory else None
        if array is None:
            raise _emulator.LaunchError(f"address {int(address):#x} is not of a live array")
        return np.asarray(array).view(np.uint8).view(dtype)

    def launch(self, name: str) -> Any:
        port = getattr(self, name)

        def run(grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]) -> None:
            assert len(grid) == len(block) == 1
            assert grid[0] >= 1
            assert 32 <= block[0] <= 1024
            assert all(isinstance(a, (_emulator.Array, np.integer)) for a in args), args
            self.launches[name] += 1
            port(*args)

        return run

    # -- the kernels ---------------------------------------------------------------------
    def _chunk(self, t: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
        """The object record of chunk ``c`` and its rows (``object_of``, the bounds)."""
        n_objects = int(t[0])
        chunks = t[t[2] : t[2] + n_objects + 1]
        o = int(np.searchsorted(chunks[:n_objects], c, side="right")) - 1
        record = t[t[1] + o * _OBJECT : t[1] + (o + 1) * _OBJECT]
        start = (c - int(chunks[o])) * int(t[9])
        stop = min(start + int(t[9]), int(record[0]))
        return record, np.arange(start, stop, dtype=np.int64)

    def _predicate(self, t: np.ndarray, ins: np.ndarray, slots: np.ndarray, rows: Any) -> Any:
        op = int(ins[1])
        if op == _TRUE:
            return np.ones(rows.size, bool)
        data, validity = slots[2 * ins[0]], slots[2 * ins[0] + 1]
        x = self._at(data, LOADS[int(ins[2])])[rows]
        kind = _CLASS[int(ins[3])]
        x = (x != 0).astype(np.int64) if x.dtype == np.bool_ else x.astype(kind)
        if op >= _IN:
            values = t[t[5] + ins[4] : t[5] + ins[4] + ins[5]].view(kind)
            hit = np.zeros(rows.size, bool)
            if values.size:
                lo = np.searchsorted(values, x, side="left")  # the kernel's lower bound
                hit = (lo < values.size) & (values[np.minimum(lo, values.size - 1)] == x)
            got = hit if op == _IN else ~hit
        else:
            c = np.array([ins[4]], np.int64).view(kind)[0]
            got = [x == c, x != c, x < c, x <= c, x > c, x >= c][op]
        if validity == 0:
            return got
        valid = self._at(validity, np.uint8)[rows] != 0
        null = (op == _IN) == bool(ins[6] & 2) if op >= _IN else False
        return np.where(valid, got, null)

    def _keep(self, t: np.ndarray, record: np.ndarray, rows: Any) -> Any:
        if record[2] < 0:
            return np.ones(rows.size, bool)
        program = t[t[4] + record[2] * _INSTRUCTION :]
        slots = t[t[3] + 2 * record[4] :]
        any_of, all_of = np.zeros(rows.size, bool), np.ones(rows.size, bool)
        for k in range(int(record[3])):
            ins = program[k * _INSTRUCTION : (k + 1) * _INSTRUCTION]
            all_of = all_of & self._predicate(t, ins, slots, rows)
            if ins[6] & 1:
                any_of |= all_of
                all_of = np.ones(rows.size, bool)
        return any_of

    def fused_filter_count(self, table: Any, mask_address: Any, counts: Any, n: Any) -> None:
        t = np.asarray(table)
        mask = None if int(mask_address) == 0 else self._at(mask_address, np.uint8)
        for c in range(int(n)):
            record, rows = self._chunk(t, c)
            keep = self._keep(t, record, rows)
            if mask is not None:
                mask[record[1] + rows] = keep
            counts[c] = int(keep.sum())

    def fused_offsets(self, counts: Any, n: Any) -> None:
        values = np.asarray(counts)[: int(n)].copy()
        counts[: int(n)] = np.cumsum(values) - values
        counts[int(n)] = int(values.sum())

    def fused_gather(
        self, table: Any, mask: Any, offsets: Any, out: Any, total: Any, n: Any
    ) -> None:
        t = np.asarray(table)
        total = int(total)
        outputs = t[t[7] : t[7] + 3 * t[8]].reshape(-1, 3)

        def grow(size: int, add: int) -> int:
            return -(-(size + add) // 64) * 64

        words = 0
        for size, boolean, _ in outputs:
            if not boolean:
                words = grow(words, total * int(size))
        w, f, places = 0, words, []
        for size, boolean, nullable in outputs:
            if boolean:
                at, f = f, grow(f, total * int(size))
            else:
                at, w = w, grow(w, total * int(size))
            valid_at = -1
            if nullable:
                valid_at, f = f, grow(f, total)
            places.append((int(size), at, valid_at))
        buffer = np.asarray(out)
        for c in range(int(n)):
            record, rows = self._chunk(t, c)
            kept = rows[np.asarray(mask)[record[1] + rows] != 0]
            where = int(offsets[c]) + np.arange(kept.size)
            sources = t[t[6] + 2 * record[5] :]
            for j, (size, at, valid_at) in enumerate(places):
                kind = np.dtype(f"u{size}")
                dst = buffer[at : at + total * size].view(kind)
                dst[where] = self._at(sources[2 * j], kind)[kept]
                if valid_at >= 0:
                    valid = buffer[valid_at : valid_at + total]
                    src = sources[2 * j + 1]
                    valid[where] = 1 if src == 0 else self._at(src, np.uint8)[kept]
