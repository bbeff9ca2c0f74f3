"""A filtered scan of many objects in three kernel launches and one wait.

The generic device path (``tables.filter_mask`` on CuPy, then
``frames.compact`` and one gather per column and object) launches some forty
small CuPy kernels for a warm query of four objects, each with its Python
launch overhead: the host's launches are the time, not the device's work.
For the common filter (every predicate on a fixed-width or boolean column:
ints, floats, timestamps and dates as their integer storage, booleans; with
or without nulls; any operator) this module runs the whole query in one
pass over all the query's objects:

1. one upload: a table of int64 words packs, for every object, its rows, its
   filter program (``frames._filter_program``: one instruction per predicate,
   interpreted per row; constants are data, so one compiled kernel serves
   every filter), the device addresses of the columns it reads and of its
   output columns, and the output columns' layout;
2. ``fused_filter_count``: the filter of every row of every object, in chunks
   of rows (one block a chunk): a mask byte per row and each chunk's count;
3. ``fused_offsets``: one block turns the chunk counts into each chunk's
   first output row and the total;
4. one read back (the total: the one wait), the output buffer allocated as
   ``gather_table`` lays it out (:func:`~nexus_cache.frames.gather.gather_into`);
5. ``fused_gather``: every kept row of every object, every output column
   and its validity, written into its place in that buffer, in row order.

The result is byte for byte ``gather_table``'s of the rows ``filter_mask``
keeps, on the device (``on_device``) or copied to the host in one transfer.
A filtered count runs steps 1 and 2 without the mask and reads the chunk
counts back (:func:`fused_count`).

:func:`_fused_scan` and :func:`_fused_count` are the flows, their kernels
passed in: on CUDA the kernels of :data:`FUSED_SOURCE` through the program
cache; CI runs the same flows with the kernels' NumPy ports.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from nexus_cache._tracebacks import drop_frame_locals
from nexus_cache.backends import AllocationDomain
from nexus_cache.frames._filter_program import FilterProgram, filter_program
from nexus_cache.frames._fused_source import (
    FUSED_SOURCE,
    HEADER_WORDS,
    MAX_OUTPUTS,
    OBJECT_WORDS,
)
from nexus_cache.frames.column import ColumnKind, DeviceColumn
from nexus_cache.frames.frame import DeviceFrame
from nexus_cache.frames.gather import GatherLayout, gather_into, gatherable

if TYPE_CHECKING:
    from nexus_cache.tables import TableFilter

__all__ = [
    "CHUNK_ROWS",
    "FUSED_KERNELS",
    "FUSED_SOURCE",
    "HEADER_WORDS",
    "MAX_OUTPUTS",
    "OBJECT_WORDS",
    "THREADS",
    "FusedKernels",
    "fused_count",
    "fused_scan",
    "preload_fused_kernels",
    "section_offsets",
]

#: rows of one chunk (one block of a launch handles one chunk at a time)
CHUNK_ROWS = 2048
#: threads of a block (a multiple of 32: the gather scans a block by warps)
THREADS = 256
#: the kernels, in launch order
FUSED_KERNELS = ("fused_filter_count", "fused_offsets", "fused_gather")


#: ``kernel(grid, block, args)``, as a ``cupy.RawKernel`` is called
Launch = Callable[[tuple[int, ...], tuple[int, ...], tuple[Any, ...]], None]


class FusedKernels(Protocol):
    """The three kernels the flows launch and how a device array's address is read."""

    def address(self, array: Any) -> int: ...

    def launch(self, name: str) -> Launch: ...


def section_offsets(
    outputs: Sequence[tuple[int, bool, bool]], total: int
) -> list[tuple[int, int]]:
    """The byte offsets of each output column's values and validity (-1: none) in
    the one buffer ``fused_gather`` writes, for ``outputs`` of ``(itemsize,
    boolean, nullable)`` and ``total`` rows: the kernel's own layout, which
    :class:`~nexus_cache.frames.gather.GatherLayout` must give too."""

    def grow(size: int, add: int) -> int:
        return -(-(size + add) // 64) * 64

    words = flags = 0
    placed: list[tuple[tuple[str, int], tuple[str, int] | None]] = []
    for itemsize, boolean, nullable in outputs:
        if boolean:
            values = ("flags", flags)
            flags = grow(flags, total * itemsize)
        else:
            values = ("words", words)
            words = grow(words, total * itemsize)
        validity = None
        if nullable:
            validity = ("flags", flags)
            flags = grow(flags, total)
        placed.append((values, validity))

    def at(where: tuple[str, int]) -> int:
        return where[1] + (words if where[0] == "flags" else 0)

    return [(at(v), -1 if m is None else at(m)) for v, m in placed]


@dataclass(frozen=True)
class _Packed:
    """A query's packed table (one upload) and its sizes."""

    table: np.ndarray
    chunks: int
    rows: int


def _programs(
    frames: Sequence[DeviceFrame], filters: Sequence[TableFilter | None]
) -> tuple[list[FilterProgram | None], list[dict[str, DeviceColumn]]] | None:
    """Each frame's filter program (None: every row kept) and its columns by name;
    None when one filter cannot run in the kernel."""
    out: list[FilterProgram | None] = []
    named: list[dict[str, DeviceColumn]] = []
    made: dict[tuple[int, tuple[Any, ...]], FilterProgram | None] = {}
    for frame, flt in zip(frames, filters, strict=True):
        columns = frame.columns_named()
        named.append(columns)
        if flt is None:
            out.append(None)
            continue
        key = (id(flt), tuple(columns[n].data.dtype if n in columns else n for n in flt.columns))
        program = made[key] if key in made else filter_program(flt, columns)
        if program is None:
            return None
        made[key] = program
        out.append(program)
    return out, named


def _pack(
    frames: Sequence[DeviceFrame],
    programs: Sequence[FilterProgram | None],
    named: Sequence[dict[str, DeviceColumn]],
    output: Sequence[str],
    kinds: Sequence[tuple[int, bool, bool]],
    address: Callable[[Any], int],
    chunk_rows: int,
) -> _Packed:
    """Every table the kernels read, in one int64 array (see :data:`FUSED_SOURCE`)."""
    objects: list[int] = []
    chunks = [0]
    slots: list[int] = []
    instructions: list[np.ndarray] = []
    constants: list[np.ndarray] = []
    addresses: list[int] = []
    placed: dict[int, tuple[int, int]] = {}  # program -> (first instruction, count)
    n_instructions = n_constants = 0
    rows = 0
    for frame, program, columns in zip(frames, programs, named, strict=True):
        n = frame.num_rows
        start, length = -1, 0
        if program is not None:
            known = placed.get(id(program))
            if known is None:
                words = program.instructions
                if n_constants and program.constants.size:  # its in lists: relocated
                    words = words.copy()
                    words[program.lists, 4] += n_constants
                known = placed[id(program)] = (n_instructions, len(words))
                instructions.append(words)
                constants.append(program.constants)
                n_instructions += len(words)
                n_constants += len(program.constants)
            start, length = known
        objects += [n, rows, start, length, len(slots) // 2, len(addresses) // 2]
        if program is not None:
            for name in program.slots:
                column = columns[name]
                validity = column.validity
                slots += [address(column.data), 0 if validity is None else address(validity)]
        for name in output:
            column = columns[name]
            validity = column.validity
            addresses += [address(column.data), 0 if validity is None else address(validity)]
        chunks.append(chunks[-1] + -(-n // chunk_rows))
        rows += n
    parts = [
        np.array(objects, np.int64),
        np.array(chunks, np.int64),
        np.array(slots, np.int64),
        np.concatenate(instructions).ravel() if instructions else np.zeros(0, np.int64),
        np.concatenate(constants) if constants else np.zeros(0, np.int64),
        np.array(addresses, np.int64),
        np.array([w for kind in kinds for w in kind], np.int64),
    ]
    header = np.zeros(HEADER_WORDS, np.int64)
    header[0] = len(frames)
    at = HEADER_WORDS
    for i, part in enumerate(parts):
        header[1 + i] = at
        at += part.size
    header[8], header[9] = len(output), chunk_rows
    return _Packed(np.concatenate([header, *parts]), chunks[-1], rows)


def _output_kind(frames: Sequence[DeviceFrame], name: str) -> tuple[int, bool, bool]:
    """``(itemsize, boolean, nullable)`` of output column ``name`` over ``frames``."""
    first = frames[0].column(name)
    nullable = any(f.column(name).validity is not None for f in frames)
    return first.data.dtype.itemsize, first.kind is ColumnKind.BOOL, nullable


def _release_on_failure(exc: BaseException) -> None:
    """The failed flow's frames let go of its device arrays (the mask, the counts,
    the uploaded table), though the exception's traceback lives on."""
    drop_frame_locals(exc)


def fused_scan(
    frames: Sequence[DeviceFrame],
    filters: Sequence[TableFilter | None],
    output: Sequence[str],
    domain: AllocationDomain,
    *,
    on_device: bool = False,
    checked: bool = False,
) -> pa.Table | DeviceFrame | None:
    """The rows of each frame its filter keeps (None: every row), with the ``output``
    columns, as ``gather_table`` builds them (a host table, or with ``on_device``
    a frame of ``domain``), in three launches and one wait on CUDA; None when the
    fused path cannot run it (the caller keeps the generic path): a filter on a
    column of another kind (strings, dictionaries, float16), more than
    :data:`MAX_OUTPUTS` output columns, or output columns :func:`gatherable` refuses
    (``checked``: the caller found it true just now; not asked again)."""
    return _fused_scan(
        frames, filters, output, domain, on_device, _CUDA, CHUNK_ROWS, checked=checked
    )


def fused_count(
    frames: Sequence[DeviceFrame], filters: Sequence[TableFilter | None], domain: AllocationDomain
) -> int | None:
    """The rows of ``frames`` their filters keep (None: every row), from one launch
    and one read back on CUDA; None when the fused path cannot run it."""
    return _fused_count(frames, filters, domain, _CUDA, CHUNK_ROWS)


def _fused_scan(
    frames: Sequence[DeviceFrame],
    filters: Sequence[TableFilter | None],
    output: Sequence[str],
    domain: AllocationDomain,
    on_device: bool,
    kernels: FusedKernels,
    chunk_rows: int,
    *,
    checked: bool = False,
) -> pa.Table | DeviceFrame | None:
    if len(output) > MAX_OUTPUTS or not (checked or gatherable(frames, output)):
        return None
    planned = _programs(frames, filters)
    if planned is None:
        return None
    kinds = [_output_kind(frames, name) for name in output]
    packed = _pack(frames, *planned, output, kinds, kernels.address, chunk_rows)
    xp = domain.xp
    table: Any = None
    mask: Any = None
    counts: Any = None
    args: tuple[Any, ...] | None = None
    try:
        total = 0
        blocks, chunks = _blocks(packed.chunks), np.int64(packed.chunks)
        if packed.chunks:
            table = xp.asarray(packed.table)  # the one upload
            mask = domain.empty(packed.rows, np.uint8)
            counts = domain.empty(packed.chunks + 1, np.int64)
            args = (table, np.uint64(kernels.address(mask)), counts, chunks)
            kernels.launch("fused_filter_count")((blocks,), (THREADS,), args)
            kernels.launch("fused_offsets")((1,), (THREADS,), (counts, chunks))
            total = int(counts[packed.chunks :].get()[0])  # the one wait

        def fill(layout: GatherLayout) -> None:
            if layout.offsets() != section_offsets(kinds, total):  # pragma: no cover
                raise AssertionError("fused_gather's layout differs from gather_table's")
            if total:
                args = (table, mask, counts, layout.buffer, np.int64(total), chunks)
                kernels.launch("fused_gather")((blocks,), (THREADS,), args)

        return gather_into(frames, output, total, domain, fill, on_device)
    except BaseException as exc:
        # this frame still runs: its own references go here, the finished frames' there
        table = mask = counts = args = None
        _release_on_failure(exc)
        raise


def _fused_count(
    frames: Sequence[DeviceFrame],
    filters: Sequence[TableFilter | None],
    domain: AllocationDomain,
    kernels: FusedKernels,
    chunk_rows: int,
) -> int | None:
    planned = _programs(frames, filters)
    if planned is None:
        return None
    packed = _pack(frames, *planned, (), (), kernels.address, chunk_rows)
    if not packed.chunks:
        return 0
    table: Any = None
    counts: Any = None
    args: tuple[Any, ...] | None = None
    try:
        table = domain.xp.asarray(packed.table)  # the one upload
        counts = domain.empty(packed.chunks, np.int64)
        args = (table, np.uint64(0), counts, np.int64(packed.chunks))
        kernels.launch("fused_filter_count")((_blocks(packed.chunks),), (THREADS,), args)
        return int(counts.get().sum())  # the one wait
    except BaseException as exc:
        table = counts = args = None
        _release_on_failure(exc)
        raise


def _blocks(chunks: int) -> int:
    from nexus_cache._kernel_loader import grid_blocks

    return grid_blocks(chunks, 1)


class _CudaKernels:
    """The kernels of :data:`FUSED_SOURCE` on the current CuPy device."""

    def address(self, array: Any) -> int:
        return int(array.data.ptr)

    def launch(self, name: str) -> Launch:
        from nexus_cache._kernel_loader import kernel_function

        return kernel_function(name, FUSED_SOURCE, name)  # type: ignore[no-any-return]


_CUDA = _CudaKernels()


def preload_fused_kernels() -> list[Any]:
    """Load the fused filter's kernels on the current device (through the program
    cache); returns the :class:`~nexus_cache._kernel_loader.KernelLoad` of each
    one this call loaded."""
    from nexus_cache._kernel_loader import kernel_function, kernel_loads

    before = len(kernel_loads())
    for name in FUSED_KERNELS:
        kernel_function(name, FUSED_SOURCE, name)
    return list(kernel_loads()[before:])
