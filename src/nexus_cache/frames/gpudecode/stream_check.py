"""The compressed page streams checked on the device before nvCOMP reads them.

nvCOMP does not bound-check its input: a Snappy literal length or copy
offset, or an LZ4 match offset, of a corrupt page can point anywhere, and
the read out of bounds that follows (``cudaErrorIllegalAddress``) poisons
the CUDA context of the whole process. So every Snappy and LZ4 section of
a heap is walked first, tag by tag, by the kernels here (one thread per
section, grid-stride; they copy nothing), and a section whose tags would
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

from nexus_cache.frames.gpudecode.nvcomp import NvcompRefused

__all__ = ["CHECK_KERNELS", "LZ4_CHECK", "SNAPPY_CHECK", "refuse_corrupt_streams"]

_SNAPPY_VALID = r"""
// Whether the raw Snappy stream in[0, end) decompresses to exactly `want`
// bytes with every literal and copy in bounds (tags walked, nothing copied).
__device__ bool snappy_valid(const unsigned char* in, const long long end, const long long want)
{
    long long pos = 0, produced = 0;
    unsigned long long length = 0;
    for (int shift = 0;; shift += 7) {  // the preamble: a varint of at most 5 bytes
        if (pos >= end || shift > 28) return false;
        const unsigned char b = in[pos++];
        length |= (unsigned long long)(b & 0x7F) << shift;
        if (!(b & 0x80)) break;
    }
    if (length != (unsigned long long)want) return false;
    while (pos < end) {
        const unsigned char tag = in[pos++];
        long long len, offset;
        const int kind = tag & 3;
        if (kind == 0) {  // a literal: its length inline, or in 1 to 4 bytes after the tag
            len = (tag >> 2) + 1;
            if (len > 60) {
                const int extra = (int)len - 60;
                if (end - pos < extra) return false;
                len = 0;
                for (int k = 0; k < extra; ++k) len |= (long long)in[pos + k] << (8 * k);
                len += 1;
                pos += extra;
            }
            if (len > end - pos || len > want - produced) return false;
            pos += len;
        } else {
            if (kind == 1) {  // 3-bit length, 11-bit offset
                if (end - pos < 1) return false;
                len = 4 + ((tag >> 2) & 7);
                offset = ((long long)(tag >> 5) << 8) | (long long)in[pos];
                pos += 1;
            } else if (kind == 2) {  // 16-bit offset
                if (end - pos < 2) return false;
                len = (tag >> 2) + 1;
                offset = (long long)in[pos] | ((long long)in[pos + 1] << 8);
                pos += 2;
            } else {  // 32-bit offset
                if (end - pos < 4) return false;
                len = (tag >> 2) + 1;
                offset = (long long)in[pos] | ((long long)in[pos + 1] << 8)
                    | ((long long)in[pos + 2] << 16) | ((long long)in[pos + 3] << 24);
                pos += 4;
            }
            if (offset == 0 || offset > produced || len > want - produced) return false;
        }
        produced += len;
    }
    return produced == want;
}
"""

_LZ4_VALID = r"""
// Add the 255-extension bytes of an LZ4 length at in[*pos] to *length;
// false where the input ends first.
__device__ __forceinline__ bool lz4_extend(
    const unsigned char* in, const long long end, long long* pos, long long* length)
{
    for (;;) {
        if (*pos >= end) return false;
        const unsigned char b = in[(*pos)++];
        *length += b;
        if (b != 255) return true;
    }
}

// Whether the LZ4 block in[0, end) decompresses to exactly `want` bytes with
// every literal and match in bounds, under LZ4's end-of-block rules (tags
// walked, nothing copied).
__device__ bool lz4_valid(const unsigned char* in, const long long end, const long long want)
{
    long long pos = 0, produced = 0;
    if (want == 0) return end == 1 && in[0] == 0;  // the empty block: one zero token
    for (;;) {
        if (pos >= end) return false;
        const unsigned char token = in[pos++];
        long long literals = token >> 4;
        if (literals == 15 && !lz4_extend(in, end, &pos, &literals)) return false;
        if (literals > end - pos || literals > want - produced) return false;
        pos += literals;
        produced += literals;
        if (pos == end) return produced == want;  // the last sequence: literals only
        // another sequence follows: its match starts at least 12 bytes before
        // the output's end, and at least 8 bytes of input remain
        if (produced > want - 12 || pos > end - 8) return false;
        const long long offset = (long long)in[pos] | ((long long)in[pos + 1] << 8);
        pos += 2;
        if (offset == 0 || offset > produced) return false;
        long long match = token & 15;
        if (match == 15 && !lz4_extend(in, end, &pos, &match)) return false;
        match += 4;
        if (match > want - 5 - produced) return false;  // the last 5 bytes are literals
        produced += match;
    }
}
"""

#: The kernel over a ``CODEC_valid`` function: one thread per section
#: (grid-stride over them), ``refused[j]`` 1 where section ``j`` is not a valid
#: stream of its out size, else 0.
_CHECK = r"""
extern "C" __global__ void CODEC_check(
    const unsigned char* __restrict__ heap,
    const long long* __restrict__ in_start,
    const long long* __restrict__ in_size,
    const long long* __restrict__ out_size,
    int* __restrict__ refused,
    const int n_jobs)
{
    const long long stride = (long long)blockDim.x * gridDim.x;
    const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    for (long long j = first; j < n_jobs; j += stride)
        refused[j] = CODEC_valid(heap + in_start[j], in_size[j], out_size[j]) ? 0 : 1;
}
"""

#: the compilable source of each check kernel
SNAPPY_CHECK = _SNAPPY_VALID + _CHECK.replace("CODEC", "snappy")
LZ4_CHECK = _LZ4_VALID + _CHECK.replace("CODEC", "lz4")

#: nvCOMP algorithm -> the kernel that checks its sections (the others go unchecked)
CHECK_KERNELS = {"Snappy": "snappy_check", "LZ4": "lz4_check"}

#: ``launch(kernel name, element bytes, items, arguments)``: the caller's kernel launch
_Launch = Callable[[str, int | None, int, tuple[Any, ...]], None]


def refuse_corrupt_streams(
    cp: Any,
    heap: Any,
    jobs: Mapping[str, Sequence[tuple[int, int, int, int]]],
    where: str,
    launch: _Launch,
) -> None:
    """Check every Snappy and LZ4 section of ``jobs`` (nvCOMP algorithm -> its
    ``(in offset, in size, out offset, out size)`` sections of the device byte
    array ``heap``) on the device: one launch per codec, one read back of the
    flags for all of them. Raises :class:`NvcompRefused` naming ``where`` when
    any section fails; returns when all pass (or there are none). Zstd and
    Gzip sections are not checked."""
    checked = [(a, jobs[a]) for a in CHECK_KERNELS if jobs.get(a)]
    if not checked:
        return
    total = sum(len(sections) for _, sections in checked)
    refused = cp.zeros(total, np.int32)
    at = 0
    for algorithm, sections in checked:
        n = len(sections)
        table = np.asarray([(s[0], s[1], s[3]) for s in sections], np.int64).reshape(n, 3)
        args = (
            heap,
            cp.asarray(np.ascontiguousarray(table[:, 0])),
            cp.asarray(np.ascontiguousarray(table[:, 1])),
            cp.asarray(np.ascontiguousarray(table[:, 2])),
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
