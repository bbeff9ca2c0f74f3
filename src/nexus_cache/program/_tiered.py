"""Program caches stacked fastest first: reads fall through, hits move up."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from nexus_cache.errors import ConfigError
from nexus_cache.program._counters import OpCounters
from nexus_cache.program._resource import (
    CacheStats,
    ProgramCacheResource,
    ProgramCacheValue,
    as_key_bytes,
    value_to_store,
)

__all__ = ["TieredProgramCache"]


class TieredProgramCache(ProgramCacheResource):
    """``tiers`` in order, fastest and most local first, e.g.
    ``[InMemoryProgramCache(), FileStreamProgramCache(), RedisProgramCache(url)]``.

    * A read asks each tier in turn; a hit in a lower tier is written into
      every tier above it (promoted), so the next read of the key stops
      higher up. A read served by an upper tier does not touch the lower
      ones, so each tier keeps the LRU order of the reads it served.
    * A write goes to every tier, top first; ``del`` removes the key from
      every tier (``KeyError`` only when no tier held it); ``clear`` clears
      every tier.
    * ``len`` and the sizes and eviction counts of ``stats()`` are those of
      the last tier, the store of record (the one every writer fills);
      ``hits``, ``misses`` and ``stores`` count this object's own calls.
      :meth:`tier_stats` gives each tier's own figures.
    * As thread- and process-safe as its least safe tier. A tier that
      raises on a read or write propagates the error (the Redis tier never
      does: it misses and drops instead).
    * ``close()`` closes every tier.
    """

    def __init__(self, tiers: Sequence[ProgramCacheResource]) -> None:
        if isinstance(tiers, ProgramCacheResource) or not isinstance(tiers, Sequence):
            raise ConfigError(
                f"tiers={tiers!r} is not accepted; give a list of program caches, fastest first"
            )
        tiers = tuple(tiers)
        if not tiers:
            raise ConfigError("tiers=[] is not accepted; give at least one program cache")
        for tier in tiers:
            if not isinstance(tier, ProgramCacheResource):
                raise ConfigError(
                    f"tier {tier!r} is not a program cache; use InMemoryProgramCache, "
                    "FileStreamProgramCache, SQLiteProgramCache or RedisProgramCache"
                )
        if len({id(t) for t in tiers}) != len(tiers):
            raise ConfigError("a program cache is listed twice in tiers; list each once")
        self._tiers = tiers
        self._counts = OpCounters()

    @property
    def tiers(self) -> tuple[ProgramCacheResource, ...]:
        return self._tiers

    def __getitem__(self, key: bytes | str) -> bytes:
        k = as_key_bytes(key)
        tiers = self._tiers
        for depth, tier in enumerate(tiers):
            data = tier.get(k)
            if data is not None:
                for upper in tiers[:depth]:
                    upper[k] = data
                self._counts.hit()
                return data
        self._counts.miss()
        raise KeyError(key)

    def __setitem__(self, key: bytes | str, value: ProgramCacheValue) -> None:
        k = as_key_bytes(key)
        # once, before any tier: a path-backed ObjectCode is read once, and an
        # empty value is refused before any tier stores anything
        data = value_to_store(value)
        for tier in self._tiers:
            tier[k] = data
        self._counts.stored()

    def __delitem__(self, key: bytes | str) -> None:
        k = as_key_bytes(key)
        found = False
        for tier in self._tiers:
            try:
                del tier[k]
                found = True
            except KeyError:
                pass
        if not found:
            raise KeyError(key)

    def __len__(self) -> int:
        return len(self._tiers[-1])

    def clear(self) -> None:
        for tier in self._tiers:
            tier.clear()

    def stats(self) -> CacheStats:
        last = self._tiers[-1].stats()
        own = self._counts.snapshot(last.entries, last.bytes)
        return dataclasses.replace(
            own, evictions=last.evictions, corrupt=last.corrupt, oversize=last.oversize
        )

    def tier_stats(self) -> list[CacheStats]:
        """Each tier's own :meth:`stats`, in tier order."""
        return [tier.stats() for tier in self._tiers]

    def close(self) -> None:
        for tier in self._tiers:
            tier.close()

    def __repr__(self) -> str:
        return f"TieredProgramCache([{', '.join(repr(t) for t in self._tiers)}])"
