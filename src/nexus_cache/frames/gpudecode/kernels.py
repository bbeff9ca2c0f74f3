"""CUDA kernels of the Parquet page decoder, one per step of the NumPy reference.

Each kernel does on the device what the function of :mod:`.reference` (or
:mod:`._hybrid`) named beside it does on the host, on the same layouts:

=====================  ==================================  =======================
kernel                 reference                           parallel over
=====================  ==================================  =======================
``hybrid_runs``        ``_hybrid.hybrid_runs``             streams (one thread)
``hybrid_expand``      ``_hybrid.hybrid_expand``           output values
``levels_validity``    ``reference._validity``             rows
``plain_fixed``        ``reference._plain_fixed``          dense values
``dict_gather``        ``reference._dense`` (fixed)        dense values
``dict_strings``       ``reference._dense`` (strings)      dense values
``plain_lengths``      ``reference._plain_strings``        pages (one block)
``scatter_values``     ``reference._scatter``              rows
``copy_strings``       ``reference._strings``              rows
``snappy_check``       (PyArrow's Snappy, bounds only)     sections (one block)
``lz4_check``          (PyArrow's LZ4_RAW, bounds only)    sections (one block)
=====================  ==================================  =======================

The kernels parallel over pages or sections (:data:`BLOCK_KERNELS`) run one
block each, which loads it in shared-memory tiles for one thread to walk
(:mod:`._tile`); the launch gives them one block per item. The two checks
(:mod:`.stream_check`) walk each compressed section's tags
before nvCOMP decompresses it, and refuse one that would read or write out
of bounds. PLAIN booleans are ``hybrid_expand`` over a one-run table (``packed_run``).
The prefix sums (``cumsum(valid) - 1`` and the string offsets) are CuPy's
``cumsum``. Streams, pages and the decompressed *heap* are concatenated per
column chunk, each addressed by 64-bit offsets. Every read is bounded by
the sizes passed in; a malformed stream or an index past the dictionary
sets ``error[0]`` (the caller raises SourceFormatError) instead of reading
out of bounds. Kernels are compiled by NVRTC through the package's program
cache (``nexus_cache._kernel_loader``, the package's one kernel loader), per
element size where one is needed; :func:`kernel_source` gives each source,
:func:`preload_kernels` loads them all (the service's warm-up).
"""

from __future__ import annotations

from typing import Any

from nexus_cache.frames.gpudecode._tile import TILE_SOURCE
from nexus_cache.frames.gpudecode.stream_check import LZ4_CHECK, SNAPPY_CHECK

__all__ = [
    "BLOCK_KERNELS",
    "ELEMENT_TYPES",
    "KERNEL_NAMES",
    "TYPED_KERNELS",
    "kernel_function",
    "kernel_source",
    "preload_kernels",
]

_HYBRID_RUNS = r"""
// One thread per stream: walk the run headers into the stream's run table
// (capacity: the stream's bytes + 1, as every run takes at least one byte).
// Grid-stride over the streams: the launch caps its grid, and a stream past
// the grid must still be walked. A malformed stream sets the error flag and
// goes to the next (its run count stays 0): a header past 32 bits, a run of
// no values, a bit-packed run past the stream's end (beyond its last group).
#define MAX_GROUPS 268435455LL  // (2^31 - 1) / 8: a run's values fit an int32
extern "C" __global__ void hybrid_runs(
    const unsigned char* __restrict__ data,
    const long long* __restrict__ stream_start,
    const long long* __restrict__ stream_end,
    const int* __restrict__ bit_width,
    const long long* __restrict__ count,
    const long long* __restrict__ run_base,
    long long* __restrict__ run_start,
    unsigned char* __restrict__ run_packed,
    long long* __restrict__ run_value,
    int* __restrict__ run_count,
    int* __restrict__ error,
    const int n_streams)
{
    const long long stride = (long long)blockDim.x * gridDim.x;
    const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    for (long long s = first; s < n_streams; s += stride) {
        {
            const int bw = bit_width[s];
            const long long end = stream_end[s], want = count[s];
            const long long base = run_base[s], capacity = end - stream_start[s] + 1;
            long long pos = stream_start[s], done = 0;
            int runs = 0;
            run_count[s] = 0;
            if (bw < 0 || bw > 32) goto malformed;
            const int value_bytes = (bw + 7) / 8;
            while (done < want) {
                unsigned long long header = 0;
                int shift = 0;
                for (;;) {
                    if (pos >= end || shift >= 35) goto malformed;
                    unsigned char b = data[pos++];
                    header |= (unsigned long long)(b & 0x7F) << shift;
                    if (!(b & 0x80)) break;
                    shift += 7;
                }
                if (header >> 32) goto malformed;  // run headers are 32-bit
                long long length, take;
                if (header & 1) {
                    // header >> 1 groups of 8 values, every group inside the
                    // stream but the last, which may be cut short
                    const long long groups = (long long)(header >> 1);
                    if (groups == 0 || groups > MAX_GROUPS) goto malformed;
                    long long size = groups * bw;
                    length = groups * 8;
                    if (size > end - pos) {
                        size = end - pos;
                        length = size * 8 / bw;
                        if (length <= (groups - 1) * 8) goto malformed;
                    }
                    take = length < want - done ? length : want - done;
                    if (take) {
                        if (runs >= capacity) goto malformed;
                        run_start[base + runs] = done;
                        run_packed[base + runs] = 1;
                        run_value[base + runs] = pos;
                        ++runs;
                    }
                    pos += size;
                } else {
                    length = (long long)(header >> 1);
                    if (length == 0) goto malformed;  // a run of no values
                    take = length < want - done ? length : want - done;
                    if (pos + value_bytes > end) goto malformed;
                    unsigned long long value = 0;
                    for (int k = 0; k < value_bytes; ++k)
                        value |= (unsigned long long)data[pos + k] << (8 * k);
                    if (value >> bw) goto malformed;
                    if (take) {
                        if (runs >= capacity) goto malformed;
                        run_start[base + runs] = done;
                        run_packed[base + runs] = 0;
                        run_value[base + runs] = (long long)value;
                        ++runs;
                    }
                    pos += value_bytes;
                }
                done += take;
            }
            run_count[s] = runs;
            continue;
        }
    malformed:
        atomicExch(error, 1);
    }
}
"""

#: Shared by the kernels that find their page, stream or run: the last index
#: in ``[0, n)`` of the ascending ``starts`` whose value is at most ``x``
#: (``starts[0] <= x`` holds for every caller).
_LAST_AT_MOST = r"""
__device__ __forceinline__ long long last_at_most(
    const long long* __restrict__ starts, long long n, long long x)
{
    long long lo = 0, hi = n;
    while (hi - lo > 1) {
        long long mid = (lo + hi) >> 1;
        if (starts[mid] <= x) lo = mid; else hi = mid;
    }
    return lo;
}
"""

_HYBRID_EXPAND = r"""
// One thread per output value: find its stream and run by binary search, then
// take the RLE value or read bit_width bits (LSB first) of the packed run.
extern "C" __global__ void hybrid_expand(
    const unsigned char* __restrict__ data,
    const long long data_size,
    const long long* __restrict__ out_base,
    const int n_streams,
    const long long* __restrict__ run_base,
    const int* __restrict__ run_count,
    const long long* __restrict__ run_start,
    const unsigned char* __restrict__ run_packed,
    const long long* __restrict__ run_value,
    const int* __restrict__ bit_width,
    unsigned int* __restrict__ out,
    const long long total)
{
    long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += stride) {
        const int lo = (int)last_at_most(out_base, n_streams, i);
        const long long local = i - out_base[lo];
        const long long first = run_base[lo];
        const long long r = first + last_at_most(run_start + first, run_count[lo], local);
        const int bw = bit_width[lo];
        unsigned int value;
        if (!run_packed[r]) {
            value = (unsigned int)run_value[r];
        } else if (bw == 0) {
            value = 0;
        } else {
            long long bit = run_value[r] * 8 + (local - run_start[r]) * bw;
            long long byte = bit >> 3;
            unsigned long long window = 0;
            for (int k = 0; k < 8; ++k)
                if (byte + k < data_size)
                    window |= (unsigned long long)data[byte + k] << (8 * k);
            value = (unsigned int)((window >> (bit & 7)) & ((1ull << bw) - 1));
        }
        out[i] = value;
    }
}
"""

_LEVELS_VALIDITY = r"""
// One thread per row: valid where the definition level is the maximum.
extern "C" __global__ void levels_validity(
    const unsigned int* __restrict__ levels,
    const unsigned int max_def,
    unsigned char* __restrict__ valid,
    int* __restrict__ error,
    const long long n)
{
    long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned int level = levels[i];
        if (level > max_def) atomicExch(error, 1);
        valid[i] = level == max_def;
    }
}
"""

_PLAIN_FIXED = r"""
// One thread per dense value: copy its bytes out of its page in the heap
// (pages start at any byte, so the copy is bytewise).
extern "C" __global__ void plain_fixed(
    const unsigned char* __restrict__ heap,
    const long long* __restrict__ page_values,
    const long long* __restrict__ dense_base,
    const int n_pages,
    ELEM_T* __restrict__ dense,
    const long long total)
{
    long long stride = (long long)blockDim.x * gridDim.x;
    for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total; k += stride) {
        const long long lo = last_at_most(dense_base, n_pages, k);
        const unsigned char* src = heap + page_values[lo] + (k - dense_base[lo]) * sizeof(ELEM_T);
        ELEM_T value = 0;
        for (int b = 0; b < (int)sizeof(ELEM_T); ++b)
            value |= (ELEM_T)src[b] << (8 * b);
        dense[k] = value;
    }
}
"""

_DICT_GATHER = r"""
// One thread per dense value: the entry its index names in its page's
// dictionary. The dictionaries of a merged chunk's row groups lie one after
// another in `dictionary`: page p's values start at dense value
// page_first[p] (ascending, page_first[0] == 0), and its dictionary is
// entries [page_base[p], page_base[p] + page_size[p]).
extern "C" __global__ void dict_gather(
    const unsigned int* __restrict__ indices,
    const ELEM_T* __restrict__ dictionary,
    const long long* __restrict__ page_first,
    const long long* __restrict__ page_base,
    const long long* __restrict__ page_size,
    const int n_pages,
    ELEM_T* __restrict__ dense,
    int* __restrict__ error,
    const long long total)
{
    long long stride = (long long)blockDim.x * gridDim.x;
    for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total; k += stride) {
        const long long p = last_at_most(page_first, n_pages, k);
        unsigned int index = indices[k];
        if (index >= page_size[p]) { atomicExch(error, 1); dense[k] = 0; continue; }
        dense[k] = dictionary[page_base[p] + index];
    }
}
"""

_DICT_STRINGS = r"""
// One thread per dense value: the (start, length) of the dictionary string its
// index names, its page's dictionary found as dict_gather finds it.
extern "C" __global__ void dict_strings(
    const unsigned int* __restrict__ indices,
    const long long* __restrict__ dict_start,
    const long long* __restrict__ dict_length,
    const long long* __restrict__ page_first,
    const long long* __restrict__ page_base,
    const long long* __restrict__ page_size,
    const int n_pages,
    long long* __restrict__ dense_start,
    long long* __restrict__ dense_length,
    int* __restrict__ error,
    const long long total)
{
    long long stride = (long long)blockDim.x * gridDim.x;
    for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total; k += stride) {
        const long long p = last_at_most(page_first, n_pages, k);
        unsigned int index = indices[k];
        if (index >= page_size[p]) {
            atomicExch(error, 1);
            dense_start[k] = 0;
            dense_length[k] = 0;
            continue;
        }
        dense_start[k] = dict_start[page_base[p] + index];
        dense_length[k] = dict_length[page_base[p] + index];
    }
}
"""

_PLAIN_LENGTHS = r"""
// One block per page (grid-stride over the pages, as the launch caps its
// grid): the page in shared-memory tiles, its PLAIN strings' 4-byte length
// prefixes walked by thread 0 (see _tile.py). A prefix or string past the
// page's end sets the error flag and ends the page's walk.
extern "C" __global__ void plain_lengths(
    const unsigned char* __restrict__ heap,
    const long long* __restrict__ page_start,
    const long long* __restrict__ page_end,
    const long long* __restrict__ dense_base,
    const long long* __restrict__ page_count,
    long long* __restrict__ dense_start,
    long long* __restrict__ dense_length,
    int* __restrict__ error,
    const int n_pages)
{
    __shared__ unsigned char tile[TILE_BYTES];
    __shared__ long long next;  // where the next tile starts; -1: the walk is over
    for (long long p = blockIdx.x; p < n_pages; p += gridDim.x) {
        const long long end = page_end[p], base = dense_base[p], count = page_count[p];
        long long pos = page_start[p], k = 0;  // thread 0's walk
        __syncthreads();  // every thread has read the last page's final `next`
        if (threadIdx.x == 0) next = count ? pos : -1;
        __syncthreads();
        for (;;) {
            const long long t0 = next;
            if (t0 < 0) break;
            const long long t1 = t0 + TILE_BYTES < end ? t0 + TILE_BYTES : end;
            load_tile(tile, heap, t0, t1);
            __syncthreads();
            if (threadIdx.x == 0) {
                // every string whose prefix starts inside the tile; where the
                // tile ends the page, every string left (past the end: refused)
                const Tile t = {tile, t0, t1, heap};
                bool over = false;
                while (k < count && (pos < t1 || t1 == end)) {
                    if (pos + 4 > end) { atomicExch(error, 1); over = true; break; }
                    const long long length = (long long)byte_at(t, pos)
                        | ((long long)byte_at(t, pos + 1) << 8)
                        | ((long long)byte_at(t, pos + 2) << 16)
                        | ((long long)byte_at(t, pos + 3) << 24);
                    if (pos + 4 + length > end) { atomicExch(error, 1); over = true; break; }
                    dense_start[base + k] = pos + 4;
                    dense_length[base + k] = length;
                    pos += 4 + length;
                    ++k;
                }
                next = over || k == count ? -1 : pos;
            }
            __syncthreads();  // the tile is walked and `next` set
        }
    }
}
"""

_SCATTER_VALUES = r"""
// One thread per row: its dense value (position = cumsum(valid) - 1) or zero.
extern "C" __global__ void scatter_values(
    const unsigned char* __restrict__ valid,
    const long long* __restrict__ position,
    const ELEM_T* __restrict__ dense,
    ELEM_T* __restrict__ out,
    const long long n)
{
    long long stride = (long long)blockDim.x * gridDim.x;
    for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < n; r += stride) {
        out[r] = valid[r] ? dense[position[r]] : (ELEM_T)0;
    }
}
"""

_COPY_STRINGS = r"""
// One thread per row: copy its bytes from the heap to its offsets.
extern "C" __global__ void copy_strings(
    const unsigned char* __restrict__ heap,
    const long long* __restrict__ row_start,
    const long long* __restrict__ offsets,
    unsigned char* __restrict__ out,
    const long long n)
{
    long long stride = (long long)blockDim.x * gridDim.x;
    for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < n; r += stride) {
        const unsigned char* src = heap + row_start[r];
        unsigned char* dst = out + offsets[r];
        const long long length = offsets[r + 1] - offsets[r];
        for (long long j = 0; j < length; ++j) dst[j] = src[j];
    }
}
"""

_SOURCES = {
    "hybrid_runs": _HYBRID_RUNS,
    "hybrid_expand": _LAST_AT_MOST + _HYBRID_EXPAND,
    "levels_validity": _LEVELS_VALIDITY,
    "plain_fixed": _LAST_AT_MOST + _PLAIN_FIXED,
    "dict_gather": _LAST_AT_MOST + _DICT_GATHER,
    "dict_strings": _LAST_AT_MOST + _DICT_STRINGS,
    "plain_lengths": TILE_SOURCE + _PLAIN_LENGTHS,
    "scatter_values": _SCATTER_VALUES,
    "copy_strings": _COPY_STRINGS,
    "snappy_check": SNAPPY_CHECK,
    "lz4_check": LZ4_CHECK,
}
KERNEL_NAMES = tuple(_SOURCES)
#: element size in bytes -> the C type a typed kernel moves values as
ELEMENT_TYPES = {1: "unsigned char", 4: "unsigned int", 8: "unsigned long long"}
#: kernels compiled once per element size (the others take no ELEM_T)
TYPED_KERNELS = ("plain_fixed", "dict_gather", "scatter_values")
#: kernels launched with one block per item (a page or a section), not one thread
BLOCK_KERNELS = ("plain_lengths", "snappy_check", "lz4_check")


def kernel_source(name: str, element_bytes: int | None = None) -> str:
    """The compilable source of kernel ``name`` (``element_bytes``: 1, 4 or 8
    for the typed kernels, None for the others). KeyError for anything else."""
    source = _SOURCES[name]
    if name in TYPED_KERNELS:
        return f"typedef {ELEMENT_TYPES[element_bytes or 0]} ELEM_T;\n" + source
    if element_bytes is not None:
        raise KeyError(f"kernel {name} takes no element size")
    return source


def kernel_function(name: str, element_bytes: int | None = None) -> Any:
    """Kernel ``name`` ready on the current CuPy device (compiled through the
    program cache on first use, per device), called like a ``cupy.RawKernel``."""
    from nexus_cache._kernel_loader import kernel_function as load

    label = name if element_bytes is None else f"{name}({element_bytes} bytes)"
    return load(name, kernel_source(name, element_bytes), label)


def preload_kernels() -> list[Any]:
    """Make every page-decode kernel ready on the current device, each typed one
    for every element size. Returns the ``KernelLoad`` of each kernel this call
    loaded (none for kernels the process already holds)."""
    from nexus_cache._kernel_loader import kernel_loads

    before = len(kernel_loads())
    for name in KERNEL_NAMES:
        for size in ELEMENT_TYPES if name in TYPED_KERNELS else (None,):
            kernel_function(name, size)
    return list(kernel_loads()[before:])
