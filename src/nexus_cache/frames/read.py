"""Parquet through the lakehouse cache, decoded into a :class:`DeviceFrame`.

:func:`read_parquet` opens the source through the lakehouse cache (a hit
reads the local entry; a miss follows the cache's policy) and decodes it
with :func:`~nexus_cache.frames.decode.decode_parquet`. Through the decoded
source cache as well: :func:`~nexus_cache.frames.source.read_cached_parquet`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nexus_cache.backends import AllocationDomain
from nexus_cache.frames.decode import DecodeStats, decode_parquet
from nexus_cache.frames.frame import DeviceFrame
from nexus_cache.frames.staging import DEFAULT_SLOT_BYTES

if TYPE_CHECKING:
    from nexus_cache.lakehouse import LakehouseCache

__all__ = ["read_parquet"]


def read_parquet(
    source: str | os.PathLike[str],
    *,
    domain: AllocationDomain,
    lake: LakehouseCache | None = None,
    fs: Any = None,
    storage_options: dict[str, Any] | None = None,
    columns: Sequence[str] | None = None,
    row_groups: Sequence[int] | None = None,
    read_dictionary: Sequence[str] | None = None,
    stats: DecodeStats | None = None,
    slot_bytes: int | str = DEFAULT_SLOT_BYTES,
    threads: int | None = None,
    window_bytes: int | str | None = None,
    engine: str | None = None,
) -> DeviceFrame:
    """Open ``source`` through the lakehouse cache ``lake`` (default: the process's
    ``default_cache()``) and :func:`decode_parquet` it into ``domain``.

    The lakehouse read's diagnostics land in ``stats.lakehouse``.
    """
    if lake is None:
        from nexus_cache.lakehouse import default_cache

        lake = default_cache()
    stats = stats if stats is not None else DecodeStats()
    with lake.open(source, fs=fs, storage_options=storage_options) as handle:
        stats.lakehouse = handle.diagnostics
        return decode_parquet(
            handle,
            domain=domain,
            columns=columns,
            row_groups=row_groups,
            read_dictionary=read_dictionary,
            stats=stats,
            slot_bytes=slot_bytes,
            threads=threads,
            window_bytes=window_bytes,
            engine=engine,
        )
