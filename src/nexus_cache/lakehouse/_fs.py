"""fsspec filesystem ``nexus``: read any fsspec store through the lakehouse cache.

Two ways in::

    # URL chaining (pyarrow via fsspec, pandas, DuckDB's fsspec registration)
    fs, path = fsspec.core.url_to_fs("nexus::s3://bucket/key.parquet",
                                     s3={"anon": False}, nexus={"cache": cache})
    table = pyarrow.parquet.read_table(path, filesystem=fs)

    # wrapping a filesystem object
    fs = NexusCacheFileSystem(fs=s3fs.S3FileSystem(...), cache=cache)
    dataset = pyarrow.dataset.dataset("bucket/table/", filesystem=fs, format="parquet")

Listing and metadata calls go to the wrapped filesystem, listings and ``info``
of files always to the store itself (never from a listing cache); ``open`` for
reading goes through :meth:`LakehouseCache.open` (plan, execute, diagnostics).
The listing or ``info`` an engine makes before it opens files proves their
identities for those opens (:mod:`._proofs`): a warm dataset read costs one
LIST and no HEAD.
Without ``cache=`` the process-wide :func:`~._cache.default_cache` (configured from
the environment) is used. The filesystem is read-only. Importing this module
registers the ``nexus`` protocol with fsspec.

Paths: ``nexus::/abs/path``, ``nexus:///abs/path`` and ``nexus::file:///abs/path``
name the same local file through fsspec (pandas and pyarrow only hand URLs that
contain ``://`` to fsspec, so give them one of the last two).

Options (``storage_options={"nexus": {...}}``): ``cache`` (a
:class:`LakehouseCache`), or ``cache_storage`` (a directory: the process-wide
cache of that root, the rest of its settings from the environment), the
spelling fsspec's simplecache users bring. Any other option is refused with a
:class:`~nexus_cache.errors.ConfigError` naming it, never ignored: the
simplecache options that govern expiry and file checks have no meaning here,
since every read proves the object's identity instead.
"""

from __future__ import annotations

import os
from typing import Any

import fsspec
from fsspec.implementations.chained import ChainedFileSystem

from nexus_cache.errors import ConfigError
from nexus_cache.lakehouse._cache import LakehouseCache, default_cache
from nexus_cache.lakehouse._proofs import MetadataProofs
from nexus_cache.lakehouse._reader import LakehouseFile

__all__ = ["NexusCacheFileSystem"]

#: options of fsspec's own base class that chaining and instance caching pass on
_FSSPEC_OPTIONS = frozenset(
    {"skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths"}
)
#: simplecache/filecache options with no meaning for an identity-checked cache
_SIMPLECACHE_ONLY = frozenset(
    {
        "cache_check",
        "cache_mapper",
        "cache_storage_mode",
        "check_files",
        "compression",
        "expiry_time",
        "same_names",
    }
)


def _cache_from_options(
    cache: LakehouseCache | None, cache_storage: Any, unknown: dict[str, Any]
) -> LakehouseCache:
    if unknown:
        names = ", ".join(sorted(unknown))
        why = (
            "they are simplecache/filecache options; the nexus cache proves every "
            "object's identity instead of expiring or checking files"
            if set(unknown) <= _SIMPLECACHE_ONLY
            else "accepted: cache, cache_storage, fs, target_protocol, target_options"
        )
        raise ConfigError(
            f"nexus filesystem option(s) not supported: {names} ({why}); remove them"
        )
    if cache is not None and not isinstance(cache, LakehouseCache):
        raise ConfigError(
            f"nexus option cache={cache!r} is not a LakehouseCache; pass one, or a "
            "directory as cache_storage="
        )
    if cache_storage is None:
        return cache if cache is not None else default_cache()
    if cache is not None:
        raise ConfigError("pass either nexus option cache= or cache_storage=, not both")
    if isinstance(cache_storage, (list, tuple)):
        if len(cache_storage) != 1:
            raise ConfigError(
                f"nexus option cache_storage={cache_storage!r}: give one directory "
                "(layered cache directories are not supported)"
            )
        cache_storage = cache_storage[0]
    if not isinstance(cache_storage, (str, os.PathLike)) or cache_storage == "TMP":
        raise ConfigError(
            f"nexus option cache_storage={cache_storage!r}: give the cache directory's path"
        )
    return default_cache(cache_storage)


class NexusCacheFileSystem(ChainedFileSystem):
    """Read-only fsspec filesystem whose reads go through a :class:`LakehouseCache`.

    ``fs``: the filesystem to wrap; or ``target_protocol``/``target_options`` to
    build it (what URL chaining passes); default: the local filesystem.
    ``cache`` or ``cache_storage``: see the module notes; unknown options raise
    :class:`~nexus_cache.errors.ConfigError`.
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
        cache_storage: Any = None,
        **kwargs: Any,
    ) -> None:
        unknown = {k: v for k, v in kwargs.items() if k not in _FSSPEC_OPTIONS}
        chosen = _cache_from_options(cache, cache_storage, unknown)
        super().__init__(**kwargs)
        if fs is None:
            fs = fsspec.filesystem(target_protocol or "file", **(target_options or {}))
        self.fs = fs
        self.fo = fo
        self.cache = chosen
        self._proofs = MetadataProofs(fs)

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
        return self.cache.open(path, fs=self.fs, listed_info=self._proofs.proof(path))

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kw: Any
    ) -> bytes:
        with self.open(path, "rb") as f:
            size = f.size
            lo = 0 if start is None else (start if start >= 0 else max(0, size + start))
            hi = size if end is None else (end if end >= 0 else max(0, size + end))
            f.seek(lo)
            return f.read(max(0, hi - lo))

    # -- metadata goes to the wrapped filesystem (see _proofs) ------------------
    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        out = self._proofs.fresh("ls", self._strip_protocol(path), detail=True, **kwargs)
        return out if detail else [info["name"] for info in out]

    def info(self, path: str, **kwargs: Any) -> Any:
        return self._proofs.info(self._strip_protocol(path), **kwargs)

    def find(self, path: str, *args: Any, **kwargs: Any) -> Any:
        detail = kwargs.pop("detail", False)
        kwargs.update(zip(("maxdepth", "withdirs"), args, strict=False))
        out = self._proofs.fresh("find", self._strip_protocol(path), detail=True, **kwargs)
        return out if detail else list(out)

    def glob(self, path: str, *args: Any, **kwargs: Any) -> Any:
        detail = kwargs.pop("detail", False)
        kwargs.update(zip(("maxdepth",), args, strict=False))
        out = self._proofs.fresh("glob", self._strip_protocol(path), detail=True, **kwargs)
        return out if detail else list(out)

    def exists(self, path: str, **kwargs: Any) -> bool:
        try:
            self._proofs.proven_info(self._strip_protocol(path))
        except FileNotFoundError:
            return False
        return True

    def isfile(self, path: str) -> bool:
        try:
            return self._proofs.proven_info(self._strip_protocol(path)).get("type") == "file"
        except FileNotFoundError:
            return False

    def size(self, path: str) -> Any:
        return self._proofs.proven_info(self._strip_protocol(path)).get("size")

    def isdir(self, path: str) -> bool:
        return bool(self.fs.isdir(self._strip_protocol(path)))

    def modified(self, path: str) -> Any:
        return self.fs.modified(self._strip_protocol(path))

    def ukey(self, path: str) -> Any:
        return self.fs.ukey(self._strip_protocol(path))

    def invalidate_cache(self, path: str | None = None) -> None:
        self._proofs.clear()
        self.fs.invalidate_cache(path)

    def __repr__(self) -> str:
        return f"NexusCacheFileSystem(fs={self.fs!r}, cache={self.cache!r})"


fsspec.register_implementation("nexus", NexusCacheFileSystem, clobber=True)
