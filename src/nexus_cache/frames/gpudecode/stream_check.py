"""The compressed page streams checked on the device before nvCOMP reads them.

nvCOMP does not bound-check its input: a Snappy literal length or copy
offset, or an LZ4 match offset, of a corrupt page can point anywhere, and
the read out of bounds that follows (``cudaErrorIllegalAddress``) poisons
the CUDA context of the whole process. So every Snappy and LZ4 section of
a heap is walked first, tag by tag, by the kernels here (one block per
section, grid-stride, the section in shared-memory tiles walked by one
thread: :mod:`._tile`; they copy nothing), and a section whose tags would
read past its input, write past its output size, copy from before the
output's start, or produce other than its output size is refused:
:func:`refuse_corrupt_streams` raises :class:`.nvcomp.NvcompRefused` before
nvCOMP is called, and the caller decompresses those pages on the host,
which reads them or names the corrupt page.

=================  ========================================================
kernel             checks, per ``(in offset, in size, out size)``
=================  ========================================================
``snappy_check``   a raw Snappy stream: its length preamble equals the out
                   size; literals and copies stay inside input and output;
                   copy offsets are in ``[1, bytes produced]``
``lz4_check``      an LZ4 block (Parquet's LZ4_RAW): the same bounds, and
                   LZ4's end-of-block rules (the last sequence literals
                   only, the last five bytes literals, the last match
                   starting at least twelve bytes before the end)
=================  ========================================================

The LZ4 rules are those of LZ4's own safe decoder (which PyArrow uses), so
a block these kernels pass, PyArrow decompresses to exactly its out size.
Zstd and Gzip sections are not checked: a corrupt Zstd or Gzip page is
handed to nvCOMP as it is (for untrusted files, use the host engine).
Thread-safe: each call uses its own buffers on the current stream.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from nexus_cache.frames.gpudecode._tile import TILE_SOURCE
from nexus_cache.frames.gpudecode.nvcomp import NvcompRefused

__all__ = ["CHECK_KERNELS", "LZ4_CHECK", "SNAPPY_CHECK", "refuse_corrupt_streams"]

#: A walk's state between its steps (kept by the one thread that walks), and
#: what a step returns.
_WALK = r"""
#define WALKING 0
#define VALID 1
#define REFUSED 2
struct Walk {
    long long pos;       // the next byte to read
    long long produced;  // output bytes the tags so far produce
    long long want;      // the output size the stream must produce
    bool begun;          // Snappy: the length preamble is read
};
"""

_SNAPPY_STEP = r"""
// One step of the walk of the raw Snappy stream in[0, end): the length
// preamble (first step), or one tag; VALID once every tag is walked and they
// produce exactly `want` bytes with every literal and copy in bounds.
__device__ __forceinline__ int snappy_step(Walk* w, const Tile& in, const long long end)
{
    long long pos = w->pos;
    const long long want = w->want, produced = w->produced;
    if (!w->begun) {  // the preamble: a varint of at most 5 bytes
        unsigned long long length = 0;
        for (int shift = 0;; shift += 7) {
            if (pos >= end || shift > 28) return REFUSED;
            const unsigned char b = byte_at(in, pos++);
            length |= (unsigned long long)(b & 0x7F) << shift;
            if (!(b & 0x80)) break;
        }
        if (length != (unsigned long long)want) return REFUSED;
        w->begun = true;
        w->pos = pos;
        return WALKING;
    }
    if (pos >= end) return produced == want ? VALID : REFUSED;
    const unsigned char tag = byte_at(in, pos++);
    long long len, offset;
    const int kind = tag & 3;
    if (kind == 0) {  // a literal: its length inline, or in 1 to 4 bytes after the tag
        len = (tag >> 2) + 1;
        if (len > 60) {
            const int extra = (int)len - 60;
            if (end - pos < extra) return REFUSED;
            len = 0;
            for (int k = 0; k < extra; ++k) len |= (long long)byte_at(in, pos + k) << (8 * k);
            len += 1;
            pos += extra;
        }
        if (len > end - pos || len > want - produced) return REFUSED;
        pos += len;
    } else {
        if (kind == 1) {  // 3-bit length, 11-bit offset
            if (end - pos < 1) return REFUSED;
            len = 4 + ((tag >> 2) & 7);
            offset = ((long long)(tag >> 5) << 8) | (long long)byte_at(in, pos);
            pos += 1;
        } else if (kind == 2) {  // 16-bit offset
            if (end - pos < 2) return REFUSED;
            len = (tag >> 2) + 1;
            offset = (long long)byte_at(in, pos) | ((long long)byte_at(in, pos + 1) << 8);
            pos += 2;
        } else {  // 32-bit offset
            if (end - pos < 4) return REFUSED;
            len = (tag >> 2) + 1;
            offset = (long long)byte_at(in, pos) | ((long long)byte_at(in, pos + 1) << 8)
                | ((long long)byte_at(in, pos + 2) << 16)
                | ((long long)byte_at(in, pos + 3) << 24);
            pos += 4;
        }
        if (offset == 0 || offset > produced || len > want - produced) return REFUSED;
    }
    w->produced = produced + len;
    w->pos = pos;
    return WALKING;
}
"""

_LZ4_STEP = r"""
// Add the 255-extension bytes of an LZ4 length at in[*pos] to *length;
// false where the input ends first.
__device__ __forceinline__ bool lz4_extend(
    const Tile& in, const long long end, long long* pos, long long* length)
{
    for (;;) {
        if (*pos >= end) return false;
        const unsigned char b = byte_at(in, (*pos)++);
        *length += b;
        if (b != 255) return true;
    }
}

// One step of the walk of the LZ4 block in[0, end): one sequence; VALID once
// the last sequence (literals only) ends the block having produced exactly
// `want` bytes, every literal and match in bounds, under LZ4's end-of-block
// rules.
__device__ __forceinline__ int lz4_step(Walk* w, const Tile& in, const long long end)
{
    long long pos = w->pos, produced = w->produced;
    const long long want = w->want;
    if (want == 0) return end == 1 && byte_at(in, 0) == 0 ? VALID : REFUSED;  // one zero token
    if (pos >= end) return REFUSED;
    const unsigned char token = byte_at(in, pos++);
    long long literals = token >> 4;
    if (literals == 15 && !lz4_extend(in, end, &pos, &literals)) return REFUSED;
    if (literals > end - pos || literals > want - produced) return REFUSED;
    pos += literals;
    produced += literals;
    if (pos == end) return produced == want ? VALID : REFUSED;  // the last sequence
    // another sequence follows: its match starts at least 12 bytes before
    // the output's end, and at least 8 bytes of input remain
    if (produced > want - 12 || pos > end - 8) return REFUSED;
    const long long offset = (long long)byte_at(in, pos) | ((long long)byte_at(in, pos + 1) << 8);
    pos += 2;
    if (offset == 0 || offset > produced) return REFUSED;
    long long match = token & 15;
    if (match == 15 && !lz4_extend(in, end, &pos, &match)) return REFUSED;
    match += 4;
    if (match > want - 5 - produced) return REFUSED;  // the last 5 bytes are literals
    w->produced = produced + match;
    w->pos = pos;
    return WALKING;
}
"""

#: The kernel over a ``CODEC_step`` function: one block per section
#: (grid-stride over them), walked tile by tile (:mod:`._tile`) by thread 0;
#: ``refused[j]`` 1 where section ``j`` is not a valid stream of its out
#: size, else 0.
_CHECK = r"""
extern "C" __global__ void CODEC_check(
    const unsigned char* __restrict__ heap,
    const long long* __restrict__ in_start,
    const long long* __restrict__ in_size,
    const long long* __restrict__ out_size,
    int* __restrict__ refused,
    const int n_jobs)
{
    __shared__ unsigned char tile[TILE_BYTES];
    __shared__ long long next;  // where the next tile starts; -1: the walk is over
    for (long long j = blockIdx.x; j < n_jobs; j += gridDim.x) {
        const unsigned char* in = heap + in_start[j];
        const long long end = in_size[j];
        Walk w = {0, 0, out_size[j], false};  // thread 0's
        int status = WALKING;
        __syncthreads();  // every thread has read the last section's final `next`
        if (threadIdx.x == 0) next = 0;
        __syncthreads();
        for (;;) {
            const long long t0 = next;
            if (t0 < 0) break;
            const long long t1 = t0 + TILE_BYTES < end ? t0 + TILE_BYTES : end;
            load_tile(tile, in, t0, t1);
            __syncthreads();
            if (threadIdx.x == 0) {
                // every step that starts inside the tile; where the tile ends
                // the section, every step left (the last ones refuse or finish)
                const Tile t = {tile, t0, t1, in};
                while (status == WALKING && (w.pos < t1 || t1 == end))
                    status = CODEC_step(&w, t, end);
                next = status == WALKING ? w.pos : -1;
                if (status != WALKING) refused[j] = status == VALID ? 0 : 1;
            }
            __syncthreads();  // the tile is walked and `next` set
        }
    }
}
"""

#: the compilable source of each check kernel
SNAPPY_CHECK = TILE_SOURCE + _WALK + _SNAPPY_STEP + _CHECK.replace("CODEC", "snappy")
LZ4_CHECK = TILE_SOURCE + _WALK + _LZ4_STEP + _CHECK.replace("CODEC", "lz4")

#: nvCOMP algorithm -> the kernel that checks its sections (the others go unchecked)
CHECK_KERNELS = {"Snappy": "snappy_check", "LZ4": "lz4_check"}

#: ``launch(kernel name, element bytes, items, arguments)``: the caller's kernel launch
_Launch = Callable[[str, int | None, int, tuple[Any, ...]], None]


def refuse_corrupt_streams(
    cp: Any,
    heap: Any,
    jobs: Mapping[str, Sequence[tuple[int, int, int, int]] | np.ndarray],
    where: str,
    launch: _Launch,
) -> None:
    """Check every Snappy and LZ4 section of ``jobs`` (nvCOMP algorithm -> its
    ``(in offset, in size, out offset, out size)`` sections of the device byte
    array ``heap``, as tuples or the rows of an int64 array) on the device: one
    launch per codec, one read back of the flags for all of them. Raises
    :class:`NvcompRefused` naming ``where`` when any section fails; returns
    when all pass (or there are none). Zstd and Gzip sections are not
    checked."""
    checked = [(a, jobs[a]) for a in CHECK_KERNELS if len(jobs.get(a, ()))]
    if not checked:
        return
    total = sum(len(sections) for _, sections in checked)
    refused = cp.zeros(total, np.int32)
    at = 0
    for algorithm, sections in checked:
        n = len(sections)
        table = np.asarray(sections, np.int64).reshape(n, 4)
        args = (
            heap,
            cp.asarray(np.ascontiguousarray(table[:, 0])),
            cp.asarray(np.ascontiguousarray(table[:, 1])),
            cp.asarray(np.ascontiguousarray(table[:, 3])),
            refused[at : at + n],
            np.int32(n),
        )
        launch(CHECK_KERNELS[algorithm], None, n, args)
        at += n
    flags = np.asarray(refused.get())
    if flags.any():
        at = 0
        bad = []
        for algorithm, sections in checked:
            failed = int(np.count_nonzero(flags[at : at + len(sections)]))
            if failed:
                bad.append(f"{failed} of {len(sections)} {algorithm} pages")
            at += len(sections)
        raise NvcompRefused(
            f"{where}: {' and '.join(bad)} failed the stream check on the device "
            "(a length or offset out of bounds, or another size than the page header "
            "says): the pages are corrupt, and are not handed to nvCOMP"
        )
