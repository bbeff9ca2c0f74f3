"""Parquet through the lakehouse and the decoded source cache, in one call.

:func:`read_cached_parquet` plans the lakehouse read (which resolves the
object's identity), builds the :class:`~nexus_cache.device.SourceFrameKey`
from that identity and the projection, and asks the device's source cache:
a hit is a pinned device-to-device copy into the caller's domain; a miss
elects one decode leader per key (:func:`decode_parquet` of the planned
read), whose frame the cache then retains when it fits. The frame returned
carries the checkout (and so the pin) through every frame derived from it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nexus_cache.backends import AllocationDomain
from nexus_cache.device import SOURCE_WAIT_TIMEOUT_S, SourceCacheSubdomain, SourceFrameKey
from nexus_cache.errors import StalePlanError
from nexus_cache.frames.decode import DecodeStats, decode_parquet
from nexus_cache.frames.frame import DeviceFrame
from nexus_cache.frames.owner import FrameOwner

if TYPE_CHECKING:
    from nexus_cache.lakehouse import LakehouseCache

__all__ = ["read_cached_parquet", "source_frame_key"]


def source_frame_key(
    plan: Any,
    *,
    columns: Sequence[str] | None = None,
    row_groups: Sequence[int] | None = None,
    read_dictionary: Sequence[str] | None = None,
) -> SourceFrameKey | None:
    """The source-cache key of decoding ``plan`` (a lakehouse ``ReadPlan``).

    The source identity is the digest of the lakehouse identity (storage
    domain, content identity, location), never the raw location. ``columns``
    and ``row_groups`` of None mean "all" and key as ``()``; an explicit
    empty ``row_groups`` or ``columns`` is an empty chunk (nothing to cache,
    and not to be mistaken for "all"), which bypasses the cache. None
    when the lakehouse resolved no identity (a source it cannot vouch for is
    never cached).
    """
    identity = plan.identity
    if identity is None:
        return None
    options = (("read_dictionary", tuple(read_dictionary or ())),)
    return SourceFrameKey(
        ("lakehouse", identity.key),
        columns=tuple(columns or ()),
        row_groups=tuple(row_groups or ()),
        decode_options=options,
        empty_chunk=any(part is not None and len(part) == 0 for part in (row_groups, columns)),
    )


def read_cached_parquet(
    source: str | os.PathLike[str],
    *,
    domain: AllocationDomain,
    source_cache: SourceCacheSubdomain | None,
    lake: LakehouseCache | None = None,
    fs: Any = None,
    storage_options: dict[str, Any] | None = None,
    columns: Sequence[str] | None = None,
    row_groups: Sequence[int] | None = None,
    read_dictionary: Sequence[str] | None = None,
    timeout: float = SOURCE_WAIT_TIMEOUT_S,
    stats: DecodeStats | None = None,
) -> DeviceFrame:
    """A frame of ``source`` in ``domain``: from the source cache when resident,
    else decoded (once per key across concurrent callers) and offered to it.

    ``source_cache``: the device's ``SourceCacheSubdomain`` (None: decode
    uncached). ``lake``: the lakehouse cache (default ``default_cache()``).
    ``stats.source`` receives the checkout's ``SourceDiagnostics`` (hit,
    leader, follower, bypass); ``stats.lakehouse`` the read's diagnostics
    when this caller decoded. Release the frame (and every frame derived
    from it) to unpin the resident entry. Errors: those of
    :func:`decode_parquet`, ``SourceWaitTimeoutError`` past ``timeout``,
    ``SourceDecodeError`` when another caller's decode failed, and the
    lakehouse's ``StalePlanError`` when the object changed since planning.
    """
    if lake is None:
        from nexus_cache.lakehouse import default_cache

        lake = default_cache()
    stats = stats if stats is not None else DecodeStats()
    plan = lake.plan(source, fs=fs, storage_options=storage_options)

    def decode() -> DeviceFrame:
        with lake.execute(plan) as handle:
            stats.lakehouse = handle.diagnostics
            served = handle.diagnostics.key
            if plan.key is not None and served is not None and served != plan.key:
                # the frame would be cached under the identity of another object
                raise StalePlanError(
                    f"{source} changed between planning and reading; read it again"
                )
            return decode_parquet(
                handle,
                domain=domain,
                columns=columns,
                row_groups=row_groups,
                read_dictionary=read_dictionary,
                stats=stats,
            )

    key = source_frame_key(
        plan, columns=columns, row_groups=row_groups, read_dictionary=read_dictionary
    )
    if key is None or source_cache is None:
        return decode()
    checkout = source_cache.get_or_decode(key, decode, domain=domain, timeout=timeout)
    stats.source = checkout.diagnostics
    try:
        return checkout.value.with_owner(FrameOwner(checkout.release))
    except BaseException:
        checkout.release()
        raise
