"""Page decompression on the device with nvCOMP (the ``gpudecode`` extra).

nvCOMP (``nvidia-nvcomp-cu13``, module ``nvidia.nvcomp``) decompresses
every compressed page section of a row group (of one codec) in one batched
call: the inputs and outputs are slices of one device buffer (the *heap*,
allocated by the caller in its domain, so the outputs are charged like any
other bytes), each at an offset aligned as nvCOMP requires (an input at
:func:`input_alignment`, an output at :data:`ALIGNMENT`). Parquet's
codecs are raw streams to nvCOMP (``BitstreamKind.RAW``): Snappy, Zstd,
LZ4_RAW, and Gzip. Where nvCOMP does not import, or lacks the codec, the
caller decompresses on the host instead (:func:`device_algorithm` returns
None) and ``DecodeStats.paths`` says so. Where nvCOMP refuses a batch, the
caller decompresses those pages on the host too (a WARNING, logger
``nexus_cache.frames``), which reads them or names the corrupt page.

nvCOMP does not bound-check its input: a corrupt stream can make it read
out of bounds, which leaves the process's CUDA context unusable. The
caller checks every Snappy and LZ4 section on the device first
(:mod:`.stream_check`), and such a page never reaches this module. Zstd
and Gzip sections are not checked: a corrupt Zstd or Gzip page is handed
to nvCOMP; for untrusted files use the host engine.

nvCOMP's own scratch memory is nvCOMP's (not charged to the domain); it is
freed when the call returns.

Thread-safe: a :class:`nvidia.nvcomp.Codec` must not be shared between
threads, so a call makes its own on the caller's current stream, or takes
it from the caller's cache, which one thread keeps for one file's decode
(the stream it was made for lives as long).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from nexus_cache.errors import SourceFormatError

__all__ = [
    "CODEC_ALGORITHMS",
    "ALIGNMENT",
    "INPUT_ALIGNMENT",
    "NvcompRefused",
    "decompress_batch",
    "device_algorithm",
    "input_alignment",
    "nvcomp_module",
    "refuse_wrong_sizes",
]


class NvcompRefused(SourceFormatError):
    """nvCOMP refused a batch of pages, or inflated one to another size than its
    header says: the pages are corrupt, or nvCOMP cannot read them."""


#: Parquet codec (as PyArrow names it) -> nvCOMP algorithm for its raw stream
CODEC_ALGORITHMS = {
    "SNAPPY": "Snappy",
    "ZSTD": "Zstd",
    "LZ4": "LZ4",  # PyArrow's name for LZ4_RAW
    "LZ4_RAW": "LZ4",
    "GZIP": "Gzip",
}

#: Every output of a batch starts at a multiple of this many bytes of the heap
#: (the most any of the algorithms above requires is 8; the heap itself starts
#: at an allocation's 256-byte alignment), and so does an input placed on its
#: own.
ALIGNMENT = 16

#: nvCOMP algorithm -> the alignment (bytes) its compressed inputs need: the
#: most restrictive of nvCOMP's decompression requirements for the algorithm
#: (``nvcomp<Algorithm>RequiredDecompressionAlignment`` of nvCOMP 6's headers,
#: what ``Codec.get_required_decompression_alignment`` returns; nvCOMP 4's
#: ``nvcompBatched<Algorithm>DecompressRequiredAlignments`` ask 1 byte of the
#: inputs of all four). A page read where it lies in the file's bytes must
#: start at a multiple of this; else it is copied to a place of its own.
INPUT_ALIGNMENT = {"Snappy": 1, "LZ4": 4, "Zstd": 8, "Gzip": 8}


@functools.cache
def nvcomp_module() -> Any:
    """``nvidia.nvcomp``, or None where it does not import."""
    import importlib

    try:
        return importlib.import_module("nvidia.nvcomp")
    except Exception:  # ImportError, or a library that fails to load
        return None


def device_algorithm(codec: str) -> str | None:
    """The nvCOMP algorithm that decompresses Parquet codec ``codec`` on the
    device, or None (nvCOMP missing, or the codec not one of :data:`CODEC_ALGORITHMS`)."""
    if nvcomp_module() is None:
        return None
    return CODEC_ALGORITHMS.get(codec)


def input_alignment(algorithm: str) -> int:
    """The alignment an input of nvCOMP's ``algorithm`` needs (:data:`INPUT_ALIGNMENT`;
    :data:`ALIGNMENT` for an algorithm not listed there)."""
    return INPUT_ALIGNMENT.get(algorithm, ALIGNMENT)


def decompress_batch(
    heap: Any,
    algorithm: str,
    jobs: Sequence[tuple[int, int, int, int]] | np.ndarray,
    where: str,
    codecs: dict[tuple[str, int, int], Any] | None = None,
) -> None:
    """Decompress every ``(in offset, in size, out offset, out size)`` of ``jobs``
    (tuples, or the rows of an int64 array) within the device byte array
    ``heap``, in one batched nvCOMP call on the current CuPy stream.

    ``codecs``: the caller's cache of nvCOMP codecs (by algorithm, device and
    stream), kept for one thread's decode of one file, so its row groups
    share a codec instead of each making one; None makes one for this call.

    Raises :class:`NvcompRefused` (a SourceFormatError) naming ``where`` when
    nvCOMP refuses a stream or a page decompresses to other than its
    header's size. Returns when the
    outputs are complete on the current stream (nvCOMP reads the sizes back)."""
    if len(jobs) == 0:
        return
    import cupy

    source, in_size, out, out_size = (c.tolist() for c in _table(jobs).T)

    nvcomp = nvcomp_module()
    stream = cupy.cuda.get_current_stream().ptr
    device = cupy.cuda.runtime.getDevice()
    try:
        key = (algorithm, device, stream)
        codec = None if codecs is None else codecs.get(key)
        if codec is None:
            codec = nvcomp.Codec(
                algorithm=algorithm,
                bitstream_kind=nvcomp.BitstreamKind.RAW,
                device_id=device,
                cuda_stream=stream,
            )
            if codecs is not None:
                codecs[key] = codec
        sources = nvcomp.as_arrays(heap, source, in_size, cuda_stream=stream)
        outputs = nvcomp.as_arrays(heap, out, out_size, cuda_stream=stream)
        done = codec.decode(sources, out=outputs)
        sizes = [int(s) for s in done.buffer_sizes]
    except (RuntimeError, ValueError) as exc:
        raise NvcompRefused(
            f"{where}: {algorithm} pages failed to decompress on the device "
            f"({' '.join(str(exc).split())}): the pages are corrupt, or the device ran "
            "out of memory for nvCOMP's scratch space"
        ) from exc
    refuse_wrong_sizes(algorithm, jobs, sizes, where)


def refuse_wrong_sizes(
    algorithm: str,
    jobs: Sequence[tuple[int, int, int, int]] | np.ndarray,
    sizes: Sequence[int],
    where: str,
) -> None:
    """Raise :class:`NvcompRefused` naming ``where`` when a page of ``jobs``
    decompressed to another size (``sizes``: what the decompressor reports it
    wrote, one per job) than its header says (the job's out size)."""
    want = _table(jobs)[:, 3]
    got = np.asarray(sizes, np.int64).reshape(-1)
    if got.size != want.size:
        raise ValueError(f"{got.size} sizes for {want.size} jobs")
    wrong = np.flatnonzero(got != want)
    if wrong.size:
        k = int(wrong[0])
        raise NvcompRefused(
            f"{where}: a {algorithm} page decompressed to {int(got[k])} bytes, its header "
            f"says {int(want[k])}; the file is corrupt"
        )


def _table(jobs: Sequence[tuple[int, int, int, int]] | np.ndarray) -> np.ndarray:
    """``jobs`` as an int64 array, a row a job."""
    return np.asarray(jobs, np.int64).reshape(-1, 4)
