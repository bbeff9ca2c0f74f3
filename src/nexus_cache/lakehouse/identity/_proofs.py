"""Metadata that proves identities: what the ``nexus`` filesystem keeps from listings.

An engine lists a dataset's prefix (or asks ``info`` of one file) before it opens
the files. :class:`MetadataProofs` asks the wrapped filesystem those questions
*fresh* (``refresh=True``: never from its listing cache) and keeps each file
entry of the answer (ETag, size) as a proof of that file's identity for
:data:`PROOF_WINDOW_S` seconds. The opens, ``isfile``, ``exists`` and ``size``
that follow use it: a warm dataset read costs one LIST and no HEAD, a warm
single-file ``read_table`` one HEAD (its ``info``). Every listing and ``info``
asks the store again, so each engine-level read proves afresh; an open past the
window (or of a file never listed) proves the identity itself.

Directories and absent paths prove no identity: where the wrapped filesystem's
listing cache holds them, it answers (a missing ``_metadata`` costs no request,
as it costs none with fsspec's own caches). Thread-safe.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterable
from typing import Any

from nexus_cache.lakehouse.identity._identity import is_local_fs

__all__ = ["PROOF_WINDOW_S", "MetadataProofs"]

#: seconds a file's entry in a listing (or ``info`` answer) fetched through the
#: filesystem proves its identity for the opens that follow (a dataset read
#: lists, then opens every file); later opens prove it with a request of their own
PROOF_WINDOW_S = 10.0
#: file entries kept as proofs per filesystem object (the oldest go first)
_PROOFS_MAX = 65536


class MetadataProofs:
    """Fresh listing and ``info`` answers of ``fs``, kept as identity proofs."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs
        # a local file's identity is one stat away: nothing to prove or keep
        self.remote = not is_local_fs(fs)
        self._items: collections.OrderedDict[str, tuple[dict[str, Any], float]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()

    # -- asking the store ------------------------------------------------------
    def fresh(self, method: str, path: str, **kwargs: Any) -> Any:
        """Call the wrapped ``method`` past its listing cache; keep the file entries."""
        call = getattr(self.fs, method)
        if not self.remote:
            return call(path, **kwargs)
        sent = time.monotonic()
        try:
            out = call(path, refresh=True, **kwargs)
        except TypeError:  # no ``refresh`` keyword: drop the listing cache instead
            self.fs.invalidate_cache()
            out = call(path, **kwargs)
        if isinstance(out, dict) and "name" in out:
            self._keep([out], sent)  # info
        else:
            self._keep(out.values() if isinstance(out, dict) else out, sent)
        return out

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """Fresh metadata of ``path`` (a file's answer becomes its proof)."""
        if self.remote and self._in_listing_cache(path):
            # A directory or an absent path proves nothing: the listing cache may
            # answer. A file found there is not fresh: ask the store below.
            cached = self.fs.info(path, **kwargs)
            if cached.get("type") != "file":
                return dict(cached)
        return dict(self.fresh("info", path, **kwargs))

    def proven_info(self, path: str) -> dict[str, Any]:
        """``path``'s proof if it holds one, else :meth:`info` (between listing and opens)."""
        proof = self.proof(path)
        return dict(proof) if proof is not None else self.info(path)

    # -- the proofs ------------------------------------------------------------
    def proof(self, path: str) -> dict[str, Any] | None:
        """``path``'s entry in an answer fetched within :data:`PROOF_WINDOW_S`, else ``None``."""
        if not self.remote:
            return None
        key = self.fs._strip_protocol(path)
        with self._lock:
            found = self._items.get(key)
        if found is None or time.monotonic() - found[1] >= PROOF_WINDOW_S:
            return None
        return found[0]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def _keep(self, infos: Iterable[Any], sent: float) -> None:
        with self._lock:
            for info in infos:
                if isinstance(info, dict) and info.get("type") == "file" and "name" in info:
                    key = self.fs._strip_protocol(info["name"])
                    self._items[key] = (info, sent)
                    self._items.move_to_end(key)
            while len(self._items) > _PROOFS_MAX:
                self._items.popitem(last=False)

    def _in_listing_cache(self, path: str) -> bool:
        """Whether the wrapped filesystem's listing cache holds ``path`` or its directory."""
        dircache = getattr(self.fs, "dircache", None)
        if dircache is None:
            return False
        try:
            stripped = self.fs._strip_protocol(path).rstrip("/")
            return stripped in dircache or self.fs._parent(stripped) in dircache
        except Exception:  # a listing cache of another shape: ask the store
            return False
