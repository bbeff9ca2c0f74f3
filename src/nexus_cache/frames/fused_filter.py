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

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from nexus_cache.backends import AllocationDomain
from nexus_cache.frames._filter_program import FilterProgram, filter_program
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
#: the most output columns one fused gather writes (more: the generic path)
MAX_OUTPUTS = 32
#: words of the packed table's header: where each part starts (see ``_pack``)
HEADER_WORDS = 16
#: words of one object's record: rows, first mask row, program start (-1: every
#: row kept) and length, first slot, first output address
OBJECT_WORDS = 6
#: the kernels, in launch order
FUSED_KERNELS = ("fused_filter_count", "fused_offsets", "fused_gather")

#: One source for the three kernels. The packed table's header (int64 words):
#: 0 objects, 1 object records at, 2 chunk starts at (objects + 1 words), 3 column
#: slots at (data address, validity address or 0), 4 instructions at, 5 constants
#: at, 6 output addresses at (per object and output column: data, validity or 0),
#: 7 output columns at (itemsize, boolean, nullable), 8 output columns, 9 chunk rows.
FUSED_SOURCE = r"""
#define HEADER_WORDS 16
#define OBJECT_WORDS 6
#define INSTRUCTION_WORDS 8
#define MAX_OUTPUTS 32
#define ALIGN 64

enum { OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOT_IN, OP_TRUE };
enum { L_I8, L_I16, L_I32, L_I64, L_U8, L_U16, L_U32, L_U64, L_F32, L_F64, L_BOOL };
enum { C_SIGNED, C_UNSIGNED, C_DOUBLE };

__device__ __forceinline__ long long load_signed(const char* data, int load, long long row)
{
    switch (load) {
    case L_I8: return ((const signed char*)data)[row];
    case L_I16: return ((const short*)data)[row];
    case L_I32: return ((const int*)data)[row];
    case L_I64: return ((const long long*)data)[row];
    case L_U8: return ((const unsigned char*)data)[row];
    case L_U16: return ((const unsigned short*)data)[row];
    case L_U32: return ((const unsigned int*)data)[row];
    case L_BOOL: return ((const unsigned char*)data)[row] != 0;
    default: return (long long)((const unsigned long long*)data)[row];
    }
}

__device__ __forceinline__ double load_double(const char* data, int load, long long row)
{
    switch (load) {
    case L_F32: return (double)((const float*)data)[row];
    case L_F64: return ((const double*)data)[row];
    case L_U64: return (double)((const unsigned long long*)data)[row];
    default: return (double)load_signed(data, load, row);
    }
}

template <typename T>
__device__ __forceinline__ bool apply(int op, T x, T c)
{
    switch (op) {
    case OP_EQ: return x == c;
    case OP_NE: return x != c;
    case OP_LT: return x < c;
    case OP_LE: return x <= c;
    case OP_GT: return x > c;
    default: return x >= c;
    }
}

template <typename T>
__device__ __forceinline__ bool found(const T* values, long long n, T x)
{
    long long lo = 0, hi = n;
    while (lo < hi) {
        long long mid = (lo + hi) >> 1;
        if (values[mid] < x) lo = mid + 1; else hi = mid;
    }
    return lo < n && values[lo] == x;
}

template <typename T>
__device__ __forceinline__ bool test(const long long* in, const long long* constants, T x, T c)
{
    int op = (int)in[1];
    if (op < OP_IN) return apply<T>(op, x, c);
    bool hit = found<T>((const T*)(constants + in[4]), in[5], x);
    return op == OP_IN ? hit : !hit;
}

__device__ bool predicate(const long long* in, const long long* slots,
                          const long long* constants, long long row)
{
    int op = (int)in[1];
    if (op == OP_TRUE) return true;
    const long long* slot = slots + 2 * in[0];
    const unsigned char* validity = (const unsigned char*)slot[1];
    if (validity != 0 && !validity[row]) {
        if (op == OP_IN) return (in[6] & 2) != 0;
        if (op == OP_NOT_IN) return (in[6] & 2) == 0;
        return false;
    }
    const char* data = (const char*)slot[0];
    int load = (int)in[2];
    long long bits = in[4];
    switch (in[3]) {
    case C_SIGNED:
        return test<long long>(in, constants, load_signed(data, load, row), bits);
    case C_UNSIGNED:
        return test<unsigned long long>(
            in, constants, (unsigned long long)load_signed(data, load, row),
            (unsigned long long)bits);
    default:
        return test<double>(in, constants, load_double(data, load, row),
                            __longlong_as_double(bits));
    }
}

__device__ bool keep_row(const long long* table, const long long* object, long long row)
{
    long long start = object[2];
    if (start < 0) return true;
    const long long* program = table + table[4] + start * INSTRUCTION_WORDS;
    const long long* slots = table + table[3] + 2 * object[4];
    const long long* constants = table + table[5];
    bool any = false, all = true;
    for (long long k = 0; k < object[3]; k++) {
        const long long* in = program + k * INSTRUCTION_WORDS;
        if (all) all = predicate(in, slots, constants, row);
        if (in[6] & 1) {
            any = any || all;
            if (any) break;
            all = true;
        }
    }
    return any;
}

// the object of chunk c: the last one whose first chunk is c or before
__device__ __forceinline__ long long object_of(const long long* chunks, long long n, long long c)
{
    long long lo = 0, hi = n;
    while (hi - lo > 1) {
        long long mid = (lo + hi) >> 1;
        if (chunks[mid] <= c) lo = mid; else hi = mid;
    }
    return lo;
}

__device__ __forceinline__ long long block_sum(long long v, long long* scratch)
{
    for (int d = 16; d > 0; d >>= 1) v += __shfl_down_sync(0xffffffffu, v, d);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    long long total = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) total += scratch[w];
    __syncthreads();
    return total;
}

extern "C" __global__ void fused_filter_count(
    const long long* __restrict__ table,
    const unsigned long long mask_address,
    long long* __restrict__ counts,
    const long long n_chunks)
{
    __shared__ long long scratch[32];
    unsigned char* mask = (unsigned char*)mask_address;
    const long long n_objects = table[0];
    const long long* chunks = table + table[2];
    const long long chunk_rows = table[9];
    for (long long c = blockIdx.x; c < n_chunks; c += gridDim.x) {
        long long o = object_of(chunks, n_objects, c);
        const long long* object = table + table[1] + o * OBJECT_WORDS;
        long long start = (c - chunks[o]) * chunk_rows;
        long long stop = min(start + chunk_rows, object[0]);
        long long kept = 0;
        for (long long r = start + threadIdx.x; r < stop; r += blockDim.x) {
            bool keep = keep_row(table, object, r);
            if (mask != 0) mask[object[1] + r] = keep;
            kept += keep;
        }
        kept = block_sum(kept, scratch);
        if (threadIdx.x == 0) counts[c] = kept;
    }
}

extern "C" __global__ void fused_offsets(long long* __restrict__ counts, const long long n)
{
    __shared__ long long sums[1024];
    long long carry = 0;
    for (long long t0 = 0; t0 < n; t0 += blockDim.x) {
        long long i = t0 + threadIdx.x;
        long long v = i < n ? counts[i] : 0;
        sums[threadIdx.x] = v;
        __syncthreads();
        for (unsigned int d = 1; d < blockDim.x; d <<= 1) {
            long long add = threadIdx.x >= d ? sums[threadIdx.x - d] : 0;
            __syncthreads();
            sums[threadIdx.x] += add;
            __syncthreads();
        }
        if (i < n) counts[i] = carry + sums[threadIdx.x] - v;
        carry += sums[blockDim.x - 1];
        __syncthreads();
    }
    if (threadIdx.x == 0) counts[n] = carry;
}

extern "C" __global__ void fused_gather(
    const long long* __restrict__ table,
    const unsigned char* __restrict__ mask,
    const long long* __restrict__ offsets,
    unsigned char* __restrict__ out,
    const long long total,
    const long long n_chunks)
{
    __shared__ long long values_at[MAX_OUTPUTS], validity_at[MAX_OUTPUTS];
    __shared__ int itemsize[MAX_OUTPUTS];
    __shared__ int warp_kept[32];
    const long long n_objects = table[0];
    const long long* chunks = table + table[2];
    const long long* addresses = table + table[6];
    const long long n_out = table[8];
    const long long chunk_rows = table[9];
    if (threadIdx.x == 0) {  // gather_table's layout: words, then flags, 64-byte sections
        const long long* outputs = table + table[7];
        long long words = 0;
        for (long long j = 0; j < n_out; j++)
            if (!outputs[3 * j + 1])
                words = (words + total * outputs[3 * j] + ALIGN - 1) / ALIGN * ALIGN;
        long long w = 0, f = words;  // words is a multiple of ALIGN: so is the flags' start
        for (long long j = 0; j < n_out; j++) {
            long long size = outputs[3 * j];
            itemsize[j] = (int)size;
            if (outputs[3 * j + 1]) {
                values_at[j] = f;
                f = (f + total * size + ALIGN - 1) / ALIGN * ALIGN;
            } else {
                values_at[j] = w;
                w = (w + total * size + ALIGN - 1) / ALIGN * ALIGN;
            }
            validity_at[j] = -1;
            if (outputs[3 * j + 2]) {
                validity_at[j] = f;
                f = (f + total + ALIGN - 1) / ALIGN * ALIGN;
            }
        }
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (long long c = blockIdx.x; c < n_chunks; c += gridDim.x) {
        long long o = object_of(chunks, n_objects, c);
        const long long* object = table + table[1] + o * OBJECT_WORDS;
        const long long* sources = addresses + 2 * object[5];
        long long start = (c - chunks[o]) * chunk_rows;
        long long stop = min(start + chunk_rows, object[0]);
        long long at = offsets[c];
        for (long long r0 = start; r0 < stop; r0 += blockDim.x) {
            long long r = r0 + threadIdx.x;
            bool keep = r < stop && mask[object[1] + r];
            unsigned int ballot = __ballot_sync(0xffffffffu, keep);
            if (lane == 0) warp_kept[warp] = __popc(ballot);
            __syncthreads();
            long long before = 0, kept = 0;
            for (int w = 0; w < warps; w++) {
                if (w < warp) before += warp_kept[w];
                kept += warp_kept[w];
            }
            if (keep) {
                long long p = at + before + __popc(ballot & ((1u << lane) - 1u));
                for (long long j = 0; j < n_out; j++) {
                    const char* data = (const char*)sources[2 * j];
                    unsigned char* dst = out + values_at[j];
                    switch (itemsize[j]) {
                    case 1: dst[p] = ((const unsigned char*)data)[r]; break;
                    case 2: ((unsigned short*)dst)[p] = ((const unsigned short*)data)[r]; break;
                    case 4: ((unsigned int*)dst)[p] = ((const unsigned int*)data)[r]; break;
                    default:
                        ((unsigned long long*)dst)[p] = ((const unsigned long long*)data)[r];
                    }
                    if (validity_at[j] >= 0) {
                        const unsigned char* valid = (const unsigned char*)sources[2 * j + 1];
                        out[validity_at[j] + p] = valid == 0 ? 1 : valid[r];
                    }
                }
            }
            at += kept;
            __syncthreads();
        }
    }
}
"""

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
        columns = {c.name: c for c in frame.columns}
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
    traceback.clear_frames(exc.__traceback__)


def fused_scan(
    frames: Sequence[DeviceFrame],
    filters: Sequence[TableFilter | None],
    output: Sequence[str],
    domain: AllocationDomain,
    *,
    on_device: bool = False,
) -> pa.Table | DeviceFrame | None:
    """The rows of each frame its filter keeps (None: every row), with the ``output``
    columns, as ``gather_table`` builds them (a host table, or with ``on_device``
    a frame of ``domain``), in three launches and one wait on CUDA; None when the
    fused path cannot run it (the caller keeps the generic path): a filter on a
    column of another kind (strings, dictionaries, float16), more than
    :data:`MAX_OUTPUTS` output columns, or output columns :func:`gatherable` refuses."""
    return _fused_scan(frames, filters, output, domain, on_device, _CUDA, CHUNK_ROWS)


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
) -> pa.Table | DeviceFrame | None:
    if len(output) > MAX_OUTPUTS or not gatherable(frames, output):
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
