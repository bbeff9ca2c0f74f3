"""What the persistent backends report to the CLI: entry listings and verify results."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["EntryInfo", "VerifyReport"]


@dataclass(frozen=True)
class EntryInfo:
    """One stored entry: its on-disk name (the SHA-256 of its key), size and stamps."""

    name: str
    size: int
    atime_ns: int
    mtime_ns: int


@dataclass
class VerifyReport:
    """Outcome of checking every entry against its integrity record.

    ``corrupt`` entries were removed; ``refused`` ones (symlinks, foreign
    owners, non-files) were left alone and need a human; ``unverified`` ones
    have no usable record (sidecar fallback only) and read as misses;
    ``outdated`` ones were written by an earlier version of nexus-cache
    (never read now) and were removed.
    """

    checked: int = 0
    ok: int = 0
    corrupt: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    outdated: list[str] = field(default_factory=list)
