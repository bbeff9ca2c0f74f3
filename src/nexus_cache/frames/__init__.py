"""Device frames: Arrow tables as named columns in an allocation domain.

See ``docs/frames.md``. A :class:`DeviceFrame` holds fixed-width numbers,
booleans, dates and timestamps, plain and dictionary-encoded strings, each
with an optional validity mask, on the backend's array module (CuPy on CUDA,
NumPy on the host backend). Every buffer is allocated by the domain it lives
in, so the device ledger can charge it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:
    from nexus_cache.frames._page_engine import preload_decode_kernels as preload_decode_kernels
    from nexus_cache.frames.column import ColumnKind as ColumnKind
    from nexus_cache.frames.column import DeviceColumn as DeviceColumn
    from nexus_cache.frames.column import column_kind as column_kind
    from nexus_cache.frames.column import storage_dtype as storage_dtype
    from nexus_cache.frames.decode import DecodeStats as DecodeStats
    from nexus_cache.frames.decode import decode_parquet as decode_parquet
    from nexus_cache.frames.frame import DeviceFrame as DeviceFrame
    from nexus_cache.frames.owner import FrameOwner as FrameOwner
    from nexus_cache.frames.read import read_parquet as read_parquet
    from nexus_cache.frames.source import read_cached_parquet as read_cached_parquet
    from nexus_cache.frames.source import source_frame_key as source_frame_key
    from nexus_cache.frames.staging import DEFAULT_SLOT_BYTES as DEFAULT_SLOT_BYTES
    from nexus_cache.frames.staging import DEFAULT_SLOTS as DEFAULT_SLOTS
    from nexus_cache.frames.staging import PinnedStaging as PinnedStaging
    from nexus_cache.frames.staging import Transfer as Transfer
    from nexus_cache.frames.staging import TransferStats as TransferStats
    from nexus_cache.frames.staging import open_transfer as open_transfer
    from nexus_cache.frames.to_device import kvikio_available as kvikio_available
    from nexus_cache.frames.to_device import read_to_device as read_to_device

# public name -> module that defines it (the imports above, for type checkers)
_EXPORTS: dict[str, str] = {
    "ColumnKind": "nexus_cache.frames.column",
    "DeviceColumn": "nexus_cache.frames.column",
    "column_kind": "nexus_cache.frames.column",
    "storage_dtype": "nexus_cache.frames.column",
    "DecodeStats": "nexus_cache.frames.decode",
    "decode_parquet": "nexus_cache.frames.decode",
    "DeviceFrame": "nexus_cache.frames.frame",
    "FrameOwner": "nexus_cache.frames.owner",
    "read_parquet": "nexus_cache.frames.read",
    "read_cached_parquet": "nexus_cache.frames.source",
    "source_frame_key": "nexus_cache.frames.source",
    "DEFAULT_SLOTS": "nexus_cache.frames.staging",
    "DEFAULT_SLOT_BYTES": "nexus_cache.frames.staging",
    "PinnedStaging": "nexus_cache.frames.staging",
    "Transfer": "nexus_cache.frames.staging",
    "TransferStats": "nexus_cache.frames.staging",
    "open_transfer": "nexus_cache.frames.staging",
    "kvikio_available": "nexus_cache.frames.to_device",
    "read_to_device": "nexus_cache.frames.to_device",
    "preload_decode_kernels": "nexus_cache.frames._page_engine",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
