"""``SourceFrameKey``: the execution-frame contract the decoded source cache keys on.

The device layer knows nothing of Parquet or of the lakehouse. The scan layer
resolves a source and hands over an opaque, hashable identity tuple (for a
lakehouse object: storage domain, content identity, location); the key adds
the projected columns, the row-group / batch boundaries and the decode
options. Two requests share a cached frame only when every part is equal.

Keys are safe to log: ``repr`` and :attr:`SourceFrameKey.fingerprint` show a
digest of the key, never the identity (which may hold paths or credentials).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field

from nexus_cache.errors import ConfigError

__all__ = ["SourceBypass", "SourceFrameKey"]


class SourceBypass(enum.Enum):
    """Why a request goes around the source cache (it never touches it)."""

    #: the frame's schema depends on the query engine's exact-order scope
    EXACT_ORDER_SCOPE = "exact_order_scope"
    #: a synthetic count source (row counts, no column data)
    SYNTHETIC_COUNT = "synthetic_count"
    #: an empty chunk (no row groups, or no rows)
    EMPTY_CHUNK = "empty_chunk"

    @property
    def explanation(self) -> str:
        return _EXPLANATIONS[self]


_EXPLANATIONS = {
    SourceBypass.EXACT_ORDER_SCOPE: (
        "bypassed: the frame's schema depends on exact-order scope, so it is not reusable"
    ),
    SourceBypass.SYNTHETIC_COUNT: "bypassed: a synthetic count source has no frame to cache",
    SourceBypass.EMPTY_CHUNK: "bypassed: an empty chunk has nothing to cache",
}


def _freeze_options(options: Mapping[str, Hashable] | Iterable[tuple[str, Hashable]] | None):
    items = dict(options.items() if isinstance(options, Mapping) else (options or ()))
    for name, value in items.items():
        if not isinstance(name, str):
            raise ConfigError(f"SourceFrameKey decode option names must be str, got {name!r}")
        try:
            hash(value)
        except TypeError:
            raise ConfigError(
                f"SourceFrameKey decode option {name!r}={value!r} is not hashable"
            ) from None
    return tuple(sorted(items.items()))


@dataclass(frozen=True, repr=False)
class SourceFrameKey:
    """The resolved identity of one decoded source frame. Immutable, hashable.

    * ``source``: the opaque identity tuple from the scan layer (non-empty,
      hashable; for a lakehouse object: domain, content identity, location);
    * ``columns``: the projected columns, in frame order;
    * ``row_groups``: the row groups (chunk boundaries) decoded, in order;
    * ``batch_rows``: the batch boundary (rows per batch), or None;
    * ``decode_options``: anything else that changes the decoded bytes, as a
      mapping or pairs (stored sorted);
    * ``fingerprint`` (computed): 16 hex digits of a BLAKE2b digest of all of
      the above, the only form of the key that diagnostics and events show.

    The bypass flags do not take part in equality: a request that sets one
    never reaches the cache (:attr:`bypass`). Build the identity from plain
    values (str, int, bytes, tuples of them) so the fingerprint is stable
    across processes.
    """

    source: tuple[Hashable, ...]
    columns: tuple[str, ...] = ()
    row_groups: tuple[int, ...] = ()
    batch_rows: int | None = None
    decode_options: tuple[tuple[str, Hashable], ...] = ()
    exact_order_scope: bool = field(default=False, compare=False)
    synthetic_count: bool = field(default=False, compare=False)
    empty_chunk: bool = field(default=False, compare=False)
    #: where the source lives (a URL or path) for a status page, or None: not
    #: part of the key's identity, its fingerprint or its repr
    location: str | None = field(default=None, compare=False)
    fingerprint: str = field(init=False, compare=False, default="")

    def __post_init__(self) -> None:
        source = self.source
        if not isinstance(source, tuple) or not source:
            raise ConfigError(
                f"SourceFrameKey.source must be a non-empty tuple (the resolved identity), "
                f"got {type(source).__name__}"
            )
        try:
            hash(source)
        except TypeError:
            raise ConfigError("SourceFrameKey.source must be hashable") from None
        columns = tuple(self.columns)
        if any(not isinstance(c, str) for c in columns):
            raise ConfigError("SourceFrameKey.columns must be column names (str)")
        row_groups = tuple(self.row_groups)
        if any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in row_groups):
            raise ConfigError("SourceFrameKey.row_groups must be ints >= 0")
        batch = self.batch_rows
        if batch is not None and (
            isinstance(batch, bool) or not isinstance(batch, int) or batch < 1
        ):
            raise ConfigError(
                f"SourceFrameKey.batch_rows={batch!r}; accepted: an int >= 1 or None"
            )
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "row_groups", row_groups)
        object.__setattr__(self, "decode_options", _freeze_options(self.decode_options))
        # 16 hex digits of a BLAKE2b digest of the whole key: stable, safe to log.
        text = repr(
            (self.source, self.columns, self.row_groups, self.batch_rows, self.decode_options)
        )
        digest = hashlib.blake2b(text.encode("utf-8", "backslashreplace"), digest_size=8)
        object.__setattr__(self, "fingerprint", digest.hexdigest())

    def __repr__(self) -> str:
        return (
            f"SourceFrameKey(fingerprint={self.fingerprint}, columns={len(self.columns)}, "
            f"row_groups={len(self.row_groups)})"
        )

    @property
    def bypass(self) -> SourceBypass | None:
        """Why this request must not touch the cache, or None when it may."""
        if self.exact_order_scope:
            return SourceBypass.EXACT_ORDER_SCOPE
        if self.synthetic_count:
            return SourceBypass.SYNTHETIC_COUNT
        if self.empty_chunk:
            return SourceBypass.EMPTY_CHUNK
        return None
