"""Parquet page decoding laid out for the GPU, with a NumPy reference.

* :mod:`.pages`: page headers (our own Thrift compact reader) and the walk
  of a column chunk into pages, from the footer's offsets;
* :mod:`.support`: which chunks are supported, decided from the footer and
  the page headers before any decoding;
* :mod:`.reference`: the NumPy decoder of one column chunk into frame
  buffers, step for step what the CUDA kernels do;
* :mod:`.kernels`: the CUDA kernels, compiled through the program cache.
"""

from __future__ import annotations

from nexus_cache.frames.gpudecode.pages import (
    ChunkSpec,
    Encoding,
    Page,
    PageHeader,
    PageType,
    chunk_spec,
    read_pages,
)
from nexus_cache.frames.gpudecode.reference import decode_chunk
from nexus_cache.frames.gpudecode.support import footer_reason, pages_reason, unsupported_reason

__all__ = [
    "ChunkSpec",
    "Encoding",
    "Page",
    "PageHeader",
    "PageType",
    "chunk_spec",
    "decode_chunk",
    "footer_reason",
    "pages_reason",
    "read_pages",
    "unsupported_reason",
]
