"""Parquet page decoding laid out for the GPU, with a NumPy reference.

* ``pages``: the walk of a column chunk into pages, from the footer's
  offsets, read into a table of arrays (``PageTable``, held by a
  ``PageList``); its page headers (``PageHeader``, our own Thrift compact
  reader) are read by ``_page_headers``;
* ``support``: which chunks are supported, decided from the footer and the
  page headers before any decoding;
* ``reference``: the NumPy decoder of one column chunk into frame buffers,
  step for step what the CUDA kernels do;
* ``kernels``: the CUDA kernels, compiled through the program cache;
* ``layout``: where each page lives in the device heap of a row group;
* ``nvcomp``: page decompression on the device (the ``gpudecode`` extra);
* ``device``: column chunks (a row group's) decoded on a CUDA device with them.

The package is lazy: each public name loads its module on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:
    from nexus_cache.frames.gpudecode._page_headers import Encoding as Encoding
    from nexus_cache.frames.gpudecode._page_headers import PageHeader as PageHeader
    from nexus_cache.frames.gpudecode._page_headers import PageType as PageType
    from nexus_cache.frames.gpudecode.device import DeviceChunk as DeviceChunk
    from nexus_cache.frames.gpudecode.device import (
        decode_chunk_on_device as decode_chunk_on_device,
    )
    from nexus_cache.frames.gpudecode.device import (
        decode_chunks_on_device as decode_chunks_on_device,
    )
    from nexus_cache.frames.gpudecode.pages import ChunkSpec as ChunkSpec
    from nexus_cache.frames.gpudecode.pages import Page as Page
    from nexus_cache.frames.gpudecode.pages import PageList as PageList
    from nexus_cache.frames.gpudecode.pages import PageTable as PageTable
    from nexus_cache.frames.gpudecode.pages import chunk_spec as chunk_spec
    from nexus_cache.frames.gpudecode.pages import chunk_specs as chunk_specs
    from nexus_cache.frames.gpudecode.pages import read_pages as read_pages
    from nexus_cache.frames.gpudecode.reference import decode_chunk as decode_chunk
    from nexus_cache.frames.gpudecode.support import footer_reason as footer_reason
    from nexus_cache.frames.gpudecode.support import pages_reason as pages_reason
    from nexus_cache.frames.gpudecode.support import unsupported_reason as unsupported_reason

# public name -> module that defines it (the imports above, for type checkers)
_EXPORTS: dict[str, str] = {
    "DeviceChunk": "nexus_cache.frames.gpudecode.device",
    "decode_chunk_on_device": "nexus_cache.frames.gpudecode.device",
    "decode_chunks_on_device": "nexus_cache.frames.gpudecode.device",
    "ChunkSpec": "nexus_cache.frames.gpudecode.pages",
    "Encoding": "nexus_cache.frames.gpudecode._page_headers",
    "Page": "nexus_cache.frames.gpudecode.pages",
    "PageHeader": "nexus_cache.frames.gpudecode._page_headers",
    "PageList": "nexus_cache.frames.gpudecode.pages",
    "PageTable": "nexus_cache.frames.gpudecode.pages",
    "PageType": "nexus_cache.frames.gpudecode._page_headers",
    "chunk_spec": "nexus_cache.frames.gpudecode.pages",
    "chunk_specs": "nexus_cache.frames.gpudecode.pages",
    "read_pages": "nexus_cache.frames.gpudecode.pages",
    "decode_chunk": "nexus_cache.frames.gpudecode.reference",
    "footer_reason": "nexus_cache.frames.gpudecode.support",
    "pages_reason": "nexus_cache.frames.gpudecode.support",
    "unsupported_reason": "nexus_cache.frames.gpudecode.support",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
