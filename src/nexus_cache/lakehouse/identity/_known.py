"""Identities proven recently, so that a warm read need not prove them again.

Two sources of proof let a warm read skip the metadata request of planning:

* **remembered identities** (:class:`KnownIdentities`): what this cache's last
  planning request or identity probe for an object answered, and when that
  request was sent. A later open of the object is planned from it; whether it
  still needs a probe is the caller's decision (the identity TTL, default 0:
  always probe, overlapped with the local read);
* **listed identities** (:func:`listed_identity`): the object's entry in a
  listing (or a metadata answer) the caller fetched from the store moments ago,
  as a dataset read does anyway. Its ETag and size are the proof; since listings
  carry no version id, an entry that matches a remembered identity in size and
  ETag proves that identity (version id included).

Nothing here contacts a store. Thread-safe.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Mapping
from typing import Any

from nexus_cache.lakehouse.identity._identity import (
    Resolution,
    SourceIdentity,
    identity_from_info,
    resolve_identity,
)
from nexus_cache.lakehouse.identity._remote import _same_content

__all__ = ["Known", "KnownIdentities", "listed_identity"]

#: remembered identities per cache; bounded so that a scan of millions of objects
#: cannot grow it without limit (an evicted one just plans with a request)
_REMEMBER_MAX = 4096

_Key = tuple[str, str, str]


def _key(fs: Any, path: str) -> _Key:
    # No network: the filesystem object's protocol and options plus the path. A
    # wrong guess costs nothing but a normal plan, since a proof still decides.
    protocol = repr(fs.protocol)  # a str or a tuple: either names the filesystem class
    return (protocol, repr(getattr(fs, "storage_options", None)), fs._strip_protocol(path))


@dataclasses.dataclass(frozen=True)
class Known:
    """An identity and when (``time.monotonic()``) the request proving it was sent."""

    identity: SourceIdentity
    proven_at: float

    def age(self) -> float:
        return time.monotonic() - self.proven_at


class KnownIdentities:
    """The last proven identity of each remote object, by ``(fs, path)``. Thread-safe."""

    def __init__(self, max_entries: int = _REMEMBER_MAX) -> None:
        self._max = max_entries
        self._items: collections.OrderedDict[_Key, Known] = collections.OrderedDict()
        self._lock = threading.Lock()

    def remember(
        self, fs: Any, path: str, identity: SourceIdentity | None, proven_at: float
    ) -> None:
        """Record what a request sent at ``proven_at`` proved; ``None`` forgets the object."""
        if fs is None:
            return  # local files: planning is one stat, nothing to save
        key = _key(fs, path)
        with self._lock:
            if identity is None:
                self._items.pop(key, None)
                return
            current = self._items.get(key)
            if current is not None and current.proven_at > proven_at:
                return  # a later proof already landed (probes answer out of order)
            self._items[key] = Known(identity, proven_at)
            self._items.move_to_end(key)
            while len(self._items) > self._max:
                self._items.popitem(last=False)

    def get(self, fs: Any, path: str) -> Known | None:
        with self._lock:
            return self._items.get(_key(fs, path))

    def resolve(self, fs: Any, path: str, *, local_min_age_s: float) -> Resolution:
        """Prove ``path``'s identity with one request (:func:`resolve_identity`)
        and keep what it proved (a failed request forgets the object: nothing
        is proven any more)."""
        sent = time.monotonic()
        try:
            res = resolve_identity(fs, path, local_min_age_s=local_min_age_s)
        except BaseException:
            self.remember(fs, path, None, sent)
            raise
        self.remember(fs, path, res.identity, sent)
        return res

    def recall(
        self, fs: Any, path: str, listed_info: Mapping[str, Any] | None, ttl_s: float
    ) -> tuple[SourceIdentity, bool] | None:
        """What is proven of ``path``'s identity without a request: ``(identity, probe)``.

        ``listed_info`` (``path``'s entry in a listing fetched just now) is the
        proof when given (:func:`listed_identity`); otherwise the identity
        remembered last, which needs a ``probe`` (a request before its bytes are
        handed out) once older than ``ttl_s``. ``None``: nothing is proven.
        """
        known = self.get(fs, path)
        if listed_info is not None:
            identity = listed_identity(fs, path, listed_info, known)
            return None if identity is None else (identity, False)
        if known is None:
            return None
        return known.identity, known.age() >= ttl_s


def listed_identity(
    fs: Any, path: str, info: Mapping[str, Any], known: Known | None
) -> SourceIdentity | None:
    """The identity that ``info`` (``path``'s entry in a fresh listing) proves, or ``None``.

    ``None`` when the entry proves none (no ETag nor version, not a file). When
    the entry matches ``known`` in size and in every field both carry, the known
    identity is proven (a listing has no version id; its ETag and size do the
    proving).
    """
    try:
        res = identity_from_info(fs, path, dict(info))
    except IsADirectoryError:
        return None
    if res.identity is None:
        return None
    if (
        known is not None
        and known.identity.location == res.identity.location
        and _same_content(known.identity, res.identity)
    ):
        return known.identity
    return res.identity
