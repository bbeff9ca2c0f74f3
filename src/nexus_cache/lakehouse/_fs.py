"""fsspec filesystem ``nexus``: read any fsspec store through the lakehouse cache.

Two ways in::

    # URL chaining (pyarrow via fsspec, pandas, DuckDB's fsspec registration)
    fs, path = fsspec.core.url_to_fs("nexus::s3://bucket/key.parquet",
                                     s3={"anon": False}, nexus={"cache": cache})
    table = pyarrow.parquet.read_table(path, filesystem=fs)

    # wrapping a filesystem object
    fs = NexusCacheFileSystem(fs=s3fs.S3FileSystem(...), cache=cache)
    dataset = pyarrow.dataset.dataset("bucket/table/", filesystem=fs, format="parquet")

Listing and metadata calls go to the wrapped filesystem, always to the store
itself (``refresh=True``: never from a listing cache); ``open`` for reading goes
through :meth:`LakehouseCache.open` (plan, execute, diagnostics).

**Metadata proves identities.** An engine lists a dataset's prefix (or asks
``info`` of one file) before it opens the files. Each file entry of such a fresh
answer (with its ETag and size) proves the file's identity for the ``open``,
``isfile``, ``exists`` and ``size`` calls that follow through this filesystem
object, for :data:`PROOF_WINDOW_S` seconds: a warm dataset read then costs one
LIST and no HEAD, a warm single-file ``read_table`` one HEAD (its ``info``), and
execution only checks that the local entry exists with the listed size. Every
``ls``/``find``/``glob``/``info`` asks the store again, so every engine-level
read proves afresh. Past the window (or for a file never listed), an open
proves the identity itself.
Without ``cache=`` the process-wide :func:`~.cache.default_cache` (configured from
the environment) is used. The filesystem is read-only. Importing this module
registers the ``nexus`` protocol with fsspec.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterable
from typing import Any

import fsspec
from fsspec.implementations.chained import ChainedFileSystem

from nexus_cache.lakehouse._cache import LakehouseCache, default_cache
from nexus_cache.lakehouse._identity import is_local_fs
from nexus_cache.lakehouse._reader import LakehouseFile

__all__ = ["PROOF_WINDOW_S", "NexusCacheFileSystem"]

#: seconds a file's entry in a listing (or ``info`` answer) fetched through the
#: filesystem proves its identity for the opens that follow (a dataset read
#: lists, then opens every file); later opens prove it with a request of their own
PROOF_WINDOW_S = 10.0
#: file entries kept as proofs per filesystem object (the oldest go first)
_PROOFS_MAX = 65536


class NexusCacheFileSystem(ChainedFileSystem):
    """Read-only fsspec filesystem whose reads go through a :class:`LakehouseCache`.

    ``fs``: the filesystem to wrap; or ``target_protocol``/``target_options`` to
    build it (what URL chaining passes); default: the local filesystem.
    Thread-safe as far as the wrapped filesystem is.
    """

    protocol = "nexus"
    root_marker = ""
    # the instance holds a cache object, which fsspec's token cannot tell apart
    cachable = False

    def __init__(
        self,
        fs: Any = None,
        *,
        target_protocol: str | None = None,
        target_options: dict[str, Any] | None = None,
        fo: str | None = None,
        cache: LakehouseCache | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if fs is None:
            fs = fsspec.filesystem(target_protocol or "file", **(target_options or {}))
        self.fs = fs
        self.fo = fo
        self.cache = cache if cache is not None else default_cache()
        # path -> (info, monotonic time its request was sent); see PROOF_WINDOW_S
        self._proofs: collections.OrderedDict[str, tuple[dict[str, Any], float]] = (
            collections.OrderedDict()
        )
        self._proofs_lock = threading.Lock()
        self._remote = not is_local_fs(fs)

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        text = str(path)
        for prefix in ("nexus::", "nexus://"):
            text = text.removeprefix(prefix)
        return text

    # -- reads through the cache -----------------------------------------------
    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: Any = None,
        autocommit: bool = True,
        cache_options: Any = None,
        **kwargs: Any,
    ) -> LakehouseFile:
        if mode != "rb":
            raise NotImplementedError(
                f"the nexus filesystem is read-only (mode={mode!r}); write through the "
                "underlying filesystem instead"
            )
        path = self._strip_protocol(path)
        return self.cache.open(path, fs=self.fs, listed_info=self._proof(path))

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kw: Any
    ) -> bytes:
        with self.open(path, "rb") as f:
            size = f.size
            lo = 0 if start is None else (start if start >= 0 else max(0, size + start))
            hi = size if end is None else (end if end >= 0 else max(0, size + end))
            f.seek(lo)
            return f.read(max(0, hi - lo))

    # -- proofs: fresh metadata answers, kept for the opens that follow ---------
    def _fresh(self, method: str, path: str, **kwargs: Any) -> Any:
        """Call the wrapped ``method`` past its listing cache (a proof must be fresh)."""
        call = getattr(self.fs, method)
        if not self._remote:
            return call(path, **kwargs)
        try:
            return call(path, refresh=True, **kwargs)
        except TypeError:  # no ``refresh`` keyword: drop the listing cache instead
            self.fs.invalidate_cache()
            return call(path, **kwargs)

    def _prove(self, infos: Iterable[Any], sent: float) -> None:
        if not self._remote:
            return  # a local file's identity is one stat away: nothing to save
        with self._proofs_lock:
            for info in infos:
                if isinstance(info, dict) and info.get("type") == "file" and "name" in info:
                    key = self.fs._strip_protocol(info["name"])
                    self._proofs[key] = (info, sent)
                    self._proofs.move_to_end(key)
            while len(self._proofs) > _PROOFS_MAX:
                self._proofs.popitem(last=False)

    def _proof(self, path: str) -> dict[str, Any] | None:
        """``path``'s entry in a listing fetched within :data:`PROOF_WINDOW_S`, else ``None``."""
        if not self._remote:
            return None
        key = self.fs._strip_protocol(path)
        with self._proofs_lock:
            found = self._proofs.get(key)
        if found is None or time.monotonic() - found[1] >= PROOF_WINDOW_S:
            return None
        return found[0]

    # -- metadata goes to the wrapped filesystem ---------------------------------
    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        sent = time.monotonic()
        out = self._fresh("ls", self._strip_protocol(path), detail=True, **kwargs)
        self._prove(out, sent)
        return out if detail else [info["name"] for info in out]

    def find(self, path: str, *args: Any, **kwargs: Any) -> Any:
        detail = kwargs.pop("detail", False)
        if args:  # maxdepth, withdirs by position
            kwargs.update(zip(("maxdepth", "withdirs"), args, strict=False))
        sent = time.monotonic()
        out = self._fresh("find", self._strip_protocol(path), detail=True, **kwargs)
        self._prove(out.values(), sent)
        return out if detail else list(out)

    def glob(self, path: str, *args: Any, **kwargs: Any) -> Any:
        detail = kwargs.pop("detail", False)
        if args:
            kwargs["maxdepth"] = args[0]
        sent = time.monotonic()
        out = self._fresh("glob", self._strip_protocol(path), detail=True, **kwargs)
        self._prove(out.values(), sent)
        return out if detail else list(out)

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

    def info(self, path: str, **kwargs: Any) -> Any:
        """Fresh metadata of ``path``; a file's answer proves its identity (see above).

        Always asked of the store for a file, even right after a listing: an
        engine's ``info`` starts a read, so the read's opens hold a fresh proof.
        """
        path = self._strip_protocol(path)
        if self._remote and self._in_listing_cache(path):
            # Directories and absent paths prove no identity: the listing cache
            # may answer them (a missing _metadata costs no request). A file
            # found there is not fresh, so it is asked of the store below.
            cached = self.fs.info(path, **kwargs)
            if cached.get("type") != "file":
                return cached
        sent = time.monotonic()
        out = self._fresh("info", path, **kwargs)
        self._prove([out], sent)
        return out

    def _proven_info(self, path: str) -> dict[str, Any]:
        # what an engine asks between its listing (or info) and its opens
        proof = self._proof(self._strip_protocol(path))
        return dict(proof) if proof is not None else dict(self.info(path))

    def exists(self, path: str, **kwargs: Any) -> bool:
        try:
            self._proven_info(path)
        except FileNotFoundError:
            return False
        return True

    def isfile(self, path: str) -> bool:
        try:
            return self._proven_info(path).get("type") == "file"
        except FileNotFoundError:
            return False

    def size(self, path: str) -> Any:
        return self._proven_info(path).get("size")

    def isdir(self, path: str) -> bool:
        return bool(self.fs.isdir(self._strip_protocol(path)))

    def modified(self, path: str) -> Any:
        return self.fs.modified(self._strip_protocol(path))

    def ukey(self, path: str) -> Any:
        return self.fs.ukey(self._strip_protocol(path))

    def invalidate_cache(self, path: str | None = None) -> None:
        with self._proofs_lock:
            self._proofs.clear()
        self.fs.invalidate_cache(path)

    def __repr__(self) -> str:
        return f"NexusCacheFileSystem(fs={self.fs!r}, cache={self.cache!r})"


fsspec.register_implementation("nexus", NexusCacheFileSystem, clobber=True)
