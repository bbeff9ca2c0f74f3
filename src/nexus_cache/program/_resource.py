"""The bytes-in / bytes-out contract every program cache backend implements."""

from __future__ import annotations

import abc
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from nexus_cache.errors import EmptyProgramError

__all__ = [
    "CacheStats",
    "ProgramCacheResource",
    "ProgramCacheValue",
    "as_key_bytes",
    "as_value_bytes",
    "value_to_store",
]

# ``ObjectCode`` stays ``Any`` here so the program cache imports nothing outside
# the standard library; values are recognised by shape, not by type.
ProgramCacheValue = bytes | bytearray | memoryview | Any


@dataclass(frozen=True)
class CacheStats:
    """Counters of one cache object since it was opened, plus its current size.

    ``entries`` and ``bytes`` describe the whole store (other processes'
    writes included, for the persistent backends); the rest count this
    object's own activity. ``oversize`` counts stores that were skipped
    because the entry alone is larger than ``max_size_bytes`` (a cache must
    never make a compile fail, so such a store is dropped, not raised).
    """

    hits: int = 0
    misses: int = 0
    stores: int = 0
    evictions: int = 0
    corrupt: int = 0
    entries: int = 0
    bytes: int = 0
    oversize: int = 0


def as_key_bytes(key: object) -> bytes:
    """Normalise a cache key: ``bytes`` pass through, ``str`` is UTF-8 encoded."""
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    raise TypeError(
        f"program cache keys must be bytes or str, got {type(key).__name__}; "
        "derive one with make_program_cache_key(...)"
    )


def as_value_bytes(value: object) -> bytes:
    """Return the binary a value stands for.

    Accepts bytes-like objects and ``cuda.core`` ``ObjectCode`` (recognised by
    its ``code`` and ``code_type`` attributes). A path-backed ``ObjectCode`` is
    read now, so the cache holds the binary rather than a path that may move.
    """
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if hasattr(value, "code") and hasattr(value, "code_type"):
        code = value.code
        if isinstance(code, (str, os.PathLike)):
            with open(code, "rb") as f:
                return f.read()
        if isinstance(code, (bytes, bytearray, memoryview)):
            return bytes(code)
        raise TypeError(f"ObjectCode.code has unsupported type {type(code).__name__}")
    raise TypeError(
        "program cache values must be bytes, bytearray, memoryview or a cuda.core "
        f"ObjectCode, got {type(value).__name__}"
    )


def value_to_store(value: object) -> bytes:
    """``value`` as the bytes a backend stores (:func:`as_value_bytes`); a value of
    0 bytes raises :class:`~nexus_cache.errors.EmptyProgramError`, so every
    backend refuses it the same way and stores nothing."""
    data = value if type(value) is bytes else as_value_bytes(value)
    if not data:
        raise EmptyProgramError(
            "refusing to store an empty program (0 bytes); nothing was stored. A compile "
            "that produced no code, such as target 'ltoir' without link-time optimization "
            "(ProgramOptions(link_time_optimization=True)), is not a program to cache"
        )
    return data


class ProgramCacheResource(abc.ABC):
    """A mapping from cache keys to compiled binaries (cubin, PTX, LTO-IR).

    Keys are ``bytes`` or ``str``; values go in as bytes-like objects or an
    ``ObjectCode`` and always come back as the ``bytes`` that went in.
    ``key in cache`` raises ``TypeError`` saying why: a check followed by
    ``cache[key]`` races with other threads and processes, so use
    :meth:`get` and test for ``None``. Iterating raises too (persistent
    backends list entries with ``iter_entries()``).

    A subclass supplies the five primitives (``__getitem__``,
    ``__setitem__``, ``__delitem__``, ``__len__``, ``clear``), as cuda.core's
    contract asks; :meth:`stats` has a default. Each backend documents its
    own thread- and process-safety guarantee.
    """

    # -- the five primitives a backend supplies -------------------------------
    @abc.abstractmethod
    def __getitem__(self, key: bytes | str) -> bytes:
        """Return the stored bytes; raise ``KeyError`` when absent (or corrupt)."""

    @abc.abstractmethod
    def __setitem__(self, key: bytes | str, value: ProgramCacheValue) -> None:
        """Store ``value`` under ``key``, replacing any previous entry.

        A value of 0 bytes raises :class:`~nexus_cache.errors.EmptyProgramError`
        (a ``ValueError``; :func:`value_to_store` converts and checks) and stores
        nothing.
        """

    @abc.abstractmethod
    def __delitem__(self, key: bytes | str) -> None:
        """Remove ``key``; raise ``KeyError`` when absent."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of entries currently stored."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Remove every entry."""

    def stats(self) -> CacheStats:
        """Counters and current size; see :class:`CacheStats`.

        This default knows only ``len(self)``: the counters stay 0 and
        ``bytes`` is 0. The nexus-cache backends count everything.
        """
        return CacheStats(entries=len(self))

    def __contains__(self, key: object) -> bool:
        raise TypeError(
            f"'key in {type(self).__name__}' is not supported: another thread or process "
            "can remove or replace the entry between the check and the read. Call "
            "cache.get(key) and test for None (one operation that returns the bytes)."
        )

    def __iter__(self) -> Any:
        raise TypeError(
            f"{type(self).__name__} is not iterable: keys are stored as digests. Use "
            "cache.get(key) for lookups; FileStreamProgramCache and SQLiteProgramCache "
            "list their entries with iter_entries()."
        )

    # -- conveniences built on the primitives ---------------------------------
    def get(self, key: bytes | str, default: bytes | None = None) -> bytes | None:
        """Return the stored bytes, or ``default`` when the key is absent."""
        try:
            return self[key]
        except KeyError:
            return default

    def update(
        self,
        items: Mapping[bytes | str, ProgramCacheValue]
        | Iterable[tuple[bytes | str, ProgramCacheValue]],
        /,
    ) -> None:
        """Store every ``(key, value)`` of a mapping or an iterable of pairs."""
        pairs = items.items() if isinstance(items, Mapping) else items
        for key, value in pairs:
            self[key] = value

    def close(self) -> None:  # noqa: B027 - optional hook, not abstract
        """Release resources (connections, handles). Idempotent."""

    def __enter__(self) -> ProgramCacheResource:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
