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
    filter: Any = None,
) -> DeviceFrame:
    """Open ``source`` through the lakehouse cache ``lake`` (default: the process's
    ``default_cache()``) and :func:`decode_parquet` it into ``domain``.

    ``filter`` (pyarrow's ``filters`` form, see :mod:`nexus_cache.tables`) keeps
    the rows that satisfy it: checked against the object's schema
    (:class:`ConfigError` before anything is decoded), the ``columns`` and the
    filter's columns are decoded, then the mask and gather run in ``domain``.
    The lakehouse read's diagnostics land in ``stats.lakehouse``.
    """
    if lake is None:
        from nexus_cache.lakehouse import default_cache

        lake = default_cache()
    stats = stats if stats is not None else DecodeStats()
    with lake.open(source, fs=fs, storage_options=storage_options) as handle:
        stats.lakehouse = handle.diagnostics
        flt = None
        wanted = columns
        if filter is not None:
            import pyarrow.parquet as pq

            from nexus_cache.tables import canonical_filter

            schema = pq.ParquetFile(handle).schema_arrow
            handle.seek(0)
            flt = canonical_filter(filter, schema)
            if columns is not None and flt is not None:
                needed = set(columns) | set(flt.columns)
                wanted = [n for n in schema.names if n in needed]
        frame = decode_parquet(
            handle,
            domain=domain,
            columns=wanted,
            row_groups=row_groups,
            read_dictionary=read_dictionary,
            stats=stats,
            slot_bytes=slot_bytes,
            threads=threads,
            window_bytes=window_bytes,
            engine=engine,
        )
    if flt is None:
        return frame
    from nexus_cache.frames.gather import filter_frame

    try:
        return filter_frame(frame, flt, frame.column_names if columns is None else list(columns))
    finally:
        frame.release()
