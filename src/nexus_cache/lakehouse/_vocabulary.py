"""The read vocabulary of the lakehouse cache: how a read was answered.

Three small enumerations, shared by planning, the policy matrix, the read handle
and the events. They hold no behaviour; kept apart from the events so that the
policy and the planner depend on the words, not on the event machinery.
"""

from __future__ import annotations

import enum

__all__ = ["CacheStatus", "FillMode", "ReadMode"]


class CacheStatus(str, enum.Enum):
    """How the cache answered a read: a hit, a miss, a bypass, or a stale plan.

    ``miss`` is a read that went to the source: it made the local copy (a
    blocking fill) or read the object remotely. ``miss-followed`` is a read
    planned as a miss that made no copy: another reader's fill, which it
    waited for, published the entry, and it read that entry locally.

    Examples
    --------
    >>> from nexus_cache.lakehouse import CacheStatus
    >>> [s.value for s in CacheStatus]
    ['hit', 'miss', 'miss-followed', 'bypass', 'stale']
    """

    HIT = "hit"
    MISS = "miss"
    MISS_FOLLOWED = "miss-followed"
    BYPASS = "bypass"
    STALE = "stale"


class ReadMode(str, enum.Enum):
    """Where the bytes of a read came from.

    Examples
    --------
    >>> from nexus_cache.lakehouse import ReadMode
    >>> [m.value for m in ReadMode]
    ['local', 'remote']
    """

    LOCAL = "local"
    REMOTE = "remote"


class FillMode(str, enum.Enum):
    """What fill a read triggered.

    Examples
    --------
    >>> from nexus_cache.lakehouse import FillMode
    >>> [m.value for m in FillMode]
    ['none', 'background', 'blocking']
    """

    NONE = "none"
    BACKGROUND = "background"
    BLOCKING = "blocking"
