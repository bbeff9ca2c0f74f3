"""Which worker a query goes to: rendezvous hashing of its source over the live workers."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from nexus_cache.service.queries import Query

__all__ = ["rendezvous_order", "routing_key"]


def routing_key(query: Query) -> str:
    """The source location a query reads: ``query.scan.location``.

    Written forms of one location agree (the one normal form of a location,
    read without touching the filesystem): surrounding blanks, a ``file://``
    or ``local://`` prefix and trailing slashes are dropped, a URL's scheme is
    lower case. Two queries on one source (a scan and a graph on its edges, or
    BFS from two vertices) share the key, so they meet the same worker's source
    and graph caches.
    """
    return query.scan.location


def _score(key: bytes, worker: str) -> bytes:
    return hashlib.sha256(key + b"\x00" + worker.encode()).digest()


def rendezvous_order(key: str, workers: Iterable[str]) -> list[str]:
    """``workers`` from the key's first choice to its last (highest random weight first).

    Each (key, worker) pair has a fixed score, so removing a worker moves only
    the keys it was first for, each to its next worker in this order, and a
    new worker takes only the keys it now scores highest for.
    """
    k = key.encode()
    return sorted(set(workers), key=lambda w: _score(k, w), reverse=True)
