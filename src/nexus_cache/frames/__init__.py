"""Device frames: Arrow tables as named columns in an allocation domain.

See ``docs/frames.md``. A :class:`DeviceFrame` holds fixed-width numbers,
booleans, dates and timestamps, plain and dictionary-encoded strings, each
with an optional validity mask, on the backend's array module (CuPy on CUDA,
NumPy on the host backend). Every buffer is allocated by the domain it lives
in, so the device ledger can charge it.
"""

from __future__ import annotations

from nexus_cache.frames.column import ColumnKind, DeviceColumn, column_kind, storage_dtype
from nexus_cache.frames.decode import DecodeStats, decode_parquet, read_parquet
from nexus_cache.frames.frame import DeviceFrame
from nexus_cache.frames.owner import FrameOwner
from nexus_cache.frames.read import kvikio_available, read_to_device
from nexus_cache.frames.source import read_cached_parquet, source_frame_key
from nexus_cache.frames.staging import (
    DEFAULT_SLOT_BYTES,
    DEFAULT_SLOTS,
    PinnedStaging,
    Transfer,
    TransferStats,
    open_transfer,
)

__all__ = [
    "DEFAULT_SLOTS",
    "DEFAULT_SLOT_BYTES",
    "ColumnKind",
    "DecodeStats",
    "DeviceColumn",
    "DeviceFrame",
    "FrameOwner",
    "PinnedStaging",
    "Transfer",
    "TransferStats",
    "column_kind",
    "decode_parquet",
    "kvikio_available",
    "open_transfer",
    "read_cached_parquet",
    "read_parquet",
    "read_to_device",
    "source_frame_key",
    "storage_dtype",
]
