"""The CUDA source of the fused filter's three kernels and the layout they share
with :mod:`nexus_cache.frames.fused_filter`, which packs their tables and launches
them. The sizes the packing and the kernels must agree on are defined here once
and written into the source as ``#define`` lines. Constants only; thread-safe.
"""

from __future__ import annotations

from nexus_cache.frames._filter_program import INSTRUCTION_WORDS

__all__ = ["FUSED_SOURCE", "HEADER_WORDS", "MAX_OUTPUTS", "OBJECT_WORDS"]

#: the most output columns one fused gather writes (more: the generic path)
MAX_OUTPUTS = 32
#: words of the packed table's header: where each part starts (see ``_pack``)
HEADER_WORDS = 16
#: words of one object's record: rows, first mask row, program start (-1: every
#: row kept) and length, first slot, first output address
OBJECT_WORDS = 6
_DEFINES = "".join(
    f"#define {name} {value}\n"
    for name, value in (
        ("HEADER_WORDS", HEADER_WORDS),
        ("OBJECT_WORDS", OBJECT_WORDS),
        ("INSTRUCTION_WORDS", INSTRUCTION_WORDS),
        ("MAX_OUTPUTS", MAX_OUTPUTS),
    )
)

#: One source for the three kernels. The packed table's header (int64 words):
#: 0 objects, 1 object records at, 2 chunk starts at (objects + 1 words), 3 column
#: slots at (data address, validity address or 0), 4 instructions at, 5 constants
#: at, 6 output addresses at (per object and output column: data, validity or 0),
#: 7 output columns at (itemsize, boolean, nullable), 8 output columns, 9 chunk rows.
FUSED_SOURCE = (
    _DEFINES
    + r"""
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
)
