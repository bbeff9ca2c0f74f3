"""Column chunks decoded on a CUDA device by the page-decode kernels.

:func:`decode_chunks_on_device` runs the steps of :mod:`.reference` with
the kernels of :mod:`.kernels`, for several chunks at once (the page
engine passes a batch of row groups' chunks, and has each column's chunks
of the batch decoded as one: ``columns``). The host reads the page headers and lays
the chunks out in one *heap*, each as its own bytes in the file
(:mod:`.layout`): one host-to-device copy
(through the caller's pinned staging when given), then one batched nvCOMP
call per codec decompresses every compressed page section on the device
(:mod:`.nvcomp`; where nvCOMP is missing or lacks the codec, the host
decompressed them while packing), and one read brings back every v1
page's level length (:mod:`._heap`). Then the device expands the levels,
computes positions by a prefix sum, decodes the pages' values and scatters
them to rows (:mod:`._steps`), every chunk phase by phase, with one read
back per phase for all the chunks together: four small reads a heap
in all, however many chunks, row groups and pages (five where nvCOMP decompresses
Snappy or LZ4 pages: the flags of their stream check, :mod:`.stream_check`).
Pages are decoded in *groups*, the longest runs of consecutive pages of one
kind (dictionary-encoded or PLAIN), each group with one launch per kernel
over a page table (a writer that falls back from the dictionary gives two
groups per row group); a merged chunk's dictionary-encoded pages each
name their own row group's dictionary, so one launch serves them all, and
each index is checked against its own dictionary's size.

Every device allocation, temporaries included, is made inside
``domain.scope()``, so the domain charges it. A malformed stream found by a
kernel raises SourceFormatError naming the chunk. Needs CuPy and a CUDA
domain; verified on a GPU by ``tests/gpu/test_gpudecode_gpu.py`` (bit for
bit against PyArrow), and its host side on CI against host ports of the
kernels (``tests/frames/gpudecode/test_device_plan.py``). Thread-safe: each
call uses its own buffers on the current stream (or the staging's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from nexus_cache._tracebacks import drop_frame_locals
from nexus_cache.errors import FrameTypeError
from nexus_cache.frames.gpudecode._heap import DeviceChunk, _Heap
from nexus_cache.frames.gpudecode._steps import decode_all
from nexus_cache.frames.gpudecode.pages import ChunkSpec, Page, read_pages
from nexus_cache.frames.gpudecode.support import is_dictionary_of_bytes, unsupported_reason

__all__ = ["DeviceChunk", "decode_chunk_on_device", "decode_chunks_on_device", "mergeable"]

_INT32_MAX = (1 << 31) - 1


def decode_chunk_on_device(
    chunk: Any,
    spec: ChunkSpec,
    domain: Any,
    pages: Sequence[Page] | None = None,
    transfer: Any = None,
    stages: dict[str, float] | None = None,
) -> DeviceChunk:
    """Decode the column chunk ``chunk`` (its bytes) into buffers of ``domain``:
    :func:`decode_chunks_on_device` of this one chunk."""
    return decode_chunks_on_device([(chunk, spec, pages)], domain, transfer, stages)[0]


def decode_chunks_on_device(
    items: Sequence[tuple[Any, ChunkSpec, Sequence[Page] | None]],
    domain: Any,
    transfer: Any = None,
    stages: dict[str, float] | None = None,
    codecs: dict[Any, Any] | None = None,
    columns: Sequence[Sequence[int]] | None = None,
    checked: bool = False,
) -> list[DeviceChunk]:
    """Decode the column chunks of ``items`` (bytes, spec, pages or None), one
    heap for all of them (a row group's: one copy to the device, one nvCOMP
    call per codec), into buffers of ``domain``.

    Each result equals :func:`.reference.decode_chunk` of its chunk, on the
    device. ``columns``: groups of indices of ``items``, each one column's
    chunks of consecutive row groups (see :func:`mergeable`), each decoded
    as one chunk (one round of launches for the group, not one per chunk)
    into one result, equal to the group's chunks joined; the results are
    then one per group, in group order (default: one per item).
    ``transfer`` (a :class:`~nexus_cache.frames.Transfer` into
    ``domain``): the heap is copied through its pinned staging and the
    decode runs on its stream; without one, a plain copy on the current
    stream. ``stages``: seconds by stage (``pack``, ``transfer``,
    ``decompress``, ``decode``) are added to it, each stage waited for before
    the next. ``codecs``: a cache of nvCOMP codecs the caller keeps for
    one thread's decode of one file (see :func:`.nvcomp.decompress_batch`).
    Raises FrameTypeError for a chunk the decoder does not support
    (check :func:`.unsupported_reason` first; ``checked``: the caller did,
    on these very pages, and they are not checked again) and
    SourceFormatError for malformed data; the buffers made so far are not kept past the error.
    The heap is freed when the call returns."""
    import cupy as cp

    resolved = []
    for chunk, spec, pages in items:
        if pages is None:
            pages = read_pages(chunk, spec)
            reason = unsupported_reason(spec, pages)
        else:
            reason = None if checked else unsupported_reason(spec, pages)
        if reason is not None:
            raise FrameTypeError(f"{spec.where(spec.start)}: {reason} is decoded on the host only")
        resolved.append((chunk, spec, pages))
    if not resolved:
        return []
    with domain.scope() if transfer is None else transfer.device():
        heap = None
        try:
            heap = _Heap(cp, resolved, transfer, stages, codecs)
            if columns is not None:
                heap.merge(columns)
            out = decode_all(heap.chunks)
            # Complete when it returns, like the host path: a caller may use the
            # buffers from any stream.
            cp.cuda.get_current_stream().synchronize()
            heap.stage("decode")
            return out
        except BaseException as exc:
            # The traceback keeps the frames of the decode steps, and with them
            # every device temporary they held, for as long as the caller keeps
            # the exception: clear them (and those of the errors it was raised
            # from) so the domain gets its bytes back now.
            drop_frame_locals(exc)
            raise
        finally:
            if heap is not None:
                heap.release()


def mergeable(specs: Sequence[ChunkSpec]) -> bool:
    """Whether one column's chunks ``specs`` (of consecutive row groups) may be
    decoded as one chunk (``columns`` of :func:`decode_chunks_on_device`): not
    when the column is read as a dictionary (each row group's dictionary is
    joined as the host joins them), nor when its strings could pass the 2 GiB
    that 32-bit offsets hold (their pages' decompressed sizes bound them)."""
    if not specs:
        return False
    t = specs[0].arrow_type
    if is_dictionary_of_bytes(t):
        return False
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return sum(s.uncompressed_size for s in specs) <= _INT32_MAX
    return True
