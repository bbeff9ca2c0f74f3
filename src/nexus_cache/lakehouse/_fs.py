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
identities for those opens (:mod:`.identity._proofs`): a warm dataset read costs one
LIST and no HEAD.
Without ``cache=`` the process-wide :func:`~._cache.default_cache` (configured from
the environment) is used. The filesystem is read-only. Importing this module
registers the ``nexus`` protocol with fsspec.

Instances are reused as fsspec reuses them (same arguments, same instance;
the path of a chained URL is no argument: one instance serves every path)
except with a ``cache=`` object; ``fsspec.open_local`` returns the local file
of an object the open serves locally; ``_cat_file``/``_cat_ranges`` are
coroutines over the synchronous reads (docs/lakehouse.md lists what else
differs from simplecache/filecache).

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

import asyncio
import os
from typing import Any

import fsspec
from fsspec.implementations.chained import ChainedFileSystem

from nexus_cache.errors import ConfigError
from nexus_cache.lakehouse._cache import LakehouseCache, default_cache
from nexus_cache.lakehouse._config import _check_root
from nexus_cache.lakehouse._reader import LakehouseFile
from nexus_cache.lakehouse.identity._proofs import MetadataProofs

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
) -> tuple[LakehouseCache | None, Any]:
    """``(cache, None)`` for an explicit cache, else ``(None, root or None)``: the
    process-wide cache to look up (:func:`default_cache`) at each use."""
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
        return cache, None
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
    # checked here, not by default_cache(), whose errors name the variable the
    # option stands for (NEXUS_LAKEHOUSE_CACHE_ROOT) instead of the option given
    _check_root(cache_storage, name="nexus option cache_storage")
    return None, cache_storage


# The base is fsspec's metaclass, which it does not export: known only at run time.
class _InstanceCache(type(ChainedFileSystem)):  # type: ignore[misc]
    """fsspec's instance cache (same configuration, same instance), except with a
    ``cache=`` object: fsspec's token is the arguments' text, which cannot tell
    two caches of one configuration apart, and a cached instance would keep
    the caller's cache alive for the life of the process.

    The path URL chaining hands over (``fo``, ``nexus::memory://a`` gives
    ``fo="/a"``) is no configuration: it is dropped before fsspec makes the
    token, so every path of one configuration shares one instance (otherwise
    each distinct path read leaves an instance behind, without bound in a
    long-running server). fsspec's ``_strip_tokenize_options`` does the same
    for simplecache, on the fsspec versions that have it.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("fo", None)
        if kwargs.get("cache") is not None:
            kwargs["skip_instance_cache"] = True
        return super().__call__(*args, **kwargs)


class NexusCacheFileSystem(ChainedFileSystem, metaclass=_InstanceCache):
    """Read-only fsspec filesystem whose reads go through a :class:`LakehouseCache`.

    ``fs``: the filesystem to wrap; or ``target_protocol``/``target_options`` to
    build it (what URL chaining passes); default: the local filesystem.
    ``cache`` or ``cache_storage``: see the module notes; unknown options raise
    :class:`~nexus_cache.errors.ConfigError`.

    Instances are reused as fsspec reuses them (the same arguments in the same
    thread and process give the same instance; the path a URL chain passes,
    ``fo``, is not one of them), except when a ``cache=`` object is passed.
    ``local_file``: ``fsspec.open_local`` returns the local file holding an
    object's bytes when the open serves it locally (a hit, a
    ``fill_before_read`` miss, a local source). Thread-safe as far as the
    wrapped filesystem is.

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem or None, optional
        The filesystem to wrap (default: the local filesystem).
    target_protocol : str or None, optional
        The protocol of the filesystem to build (``"s3"``).
    target_options : dict or None, optional
        That filesystem's options.
    cache : LakehouseCache or None, optional
        The cache to read through.
    cache_storage : str, os.PathLike or None, optional
        A cache root; the process-wide cache of that root (:func:`default_cache`).

    Raises
    ------
    ConfigError
        An option is unknown, or ``cache`` and ``cache_storage`` are both given.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import pyarrow as pa, pyarrow.parquet as pq
    >>> from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = pathlib.Path(tmp.name)
    >>> source = str(root / "data.parquet")
    >>> pq.write_table(pa.table({"x": [1, 2, 3]}), source)
    >>> config = LakehouseCacheConfig(
    ...     root=root / "cache", policy="fill_before_read", max_bytes="64M", local_min_age_s=0
    ... )
    >>> from nexus_cache.lakehouse import NexusCacheFileSystem
    >>> with LakehouseCache(config) as cache:
    ...     fs = NexusCacheFileSystem(cache=cache)
    ...     pq.read_table(source, filesystem=fs).num_rows
    ...     cache.events.reads()[-1].cache_status.value
    3
    'hit'

    URL chaining reaches it through fsspec as well, with the cache of a root:

    >>> import fsspec
    >>> with fsspec.open(f"nexus::file://{source}", nexus={"cache_storage": str(root / "c")}) as f:
    ...     f.read(4)
    b'PAR1'
    >>> tmp.cleanup()
    """

    protocol = "nexus"
    root_marker = ""
    cachable = True
    local_file = True

    def __init__(
        self,
        fs: Any = None,
        *,
        target_protocol: str | None = None,
        target_options: dict[str, Any] | None = None,
        cache: LakehouseCache | None = None,
        cache_storage: Any = None,
        **kwargs: Any,
    ) -> None:
        unknown = {k: v for k, v in kwargs.items() if k not in _FSSPEC_OPTIONS}
        self._cache, self._cache_root = _cache_from_options(cache, cache_storage, unknown)
        self.cache  # noqa: B018 (a bad root or environment fails here, not at the first read)
        super().__init__(**kwargs)
        if fs is None:
            fs = fsspec.filesystem(target_protocol or "file", **(target_options or {}))
        self.fs = fs
        self._proofs = MetadataProofs(fs)

        def strip(path: Any) -> Any:
            # On an instance: ours, then the wrapped filesystem's protocol, so
            # "nexus::memory://a", "nexus://a" and "memory://a" name one path.
            if isinstance(path, list):
                return [strip(p) for p in path]
            return fs._strip_protocol(type(self)._strip_protocol(path))

        # fsspec calls _strip_protocol on the instance too: shadow the classmethod there
        self._strip_protocol = strip  # type: ignore[method-assign]

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        """Our own prefixes only (no instance, so no wrapped filesystem to ask)."""
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        text = str(path)
        for prefix in ("nexus::", "nexus://"):
            text = text.removeprefix(prefix)
        return text

    @property
    def cache(self) -> LakehouseCache:
        """The cache reads go through: the ``cache=`` given, else the process-wide
        cache (of ``cache_storage``'s root, or from the environment), looked up
        at each use so that a reused instance follows :func:`default_cache`."""
        if self._cache is not None:
            return self._cache
        return default_cache(self._cache_root)

    def _parent(self, path: str) -> str:
        return str(self.fs._parent(self._strip_protocol(path)))

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
        # a local file's identity is one stat: no listing proves it beforehand
        listed = self._proofs.proof(path) if self._proofs.remote else None
        handle = self.cache.open(path, fs=self.fs, listed_info=listed)
        handle.name_local_file(self.fs.unstrip_protocol(path))  # what fsspec.open_local returns
        return handle

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kw: Any
    ) -> bytes:
        with self.open(path, "rb") as f:
            size = f.size
            lo = 0 if start is None else (start if start >= 0 else max(0, size + start))
            hi = size if end is None else (end if end >= 0 else max(0, size + end))
            f.seek(lo)
            return f.read(max(0, hi - lo))

    # Coroutine forms, for callers that drive filesystems asynchronously (zarr,
    # fsspec's async helpers): the work runs on a thread, as a sync one must.
    async def _cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kw: Any
    ) -> bytes:
        return await asyncio.to_thread(self.cat_file, path, start, end, **kw)

    async def _cat_ranges(
        self,
        paths: list[str],
        starts: Any,
        ends: Any,
        max_gap: Any = None,
        on_error: str = "return",
        **kw: Any,
    ) -> list[Any]:
        return await asyncio.to_thread(
            self.cat_ranges, paths, starts, ends, max_gap=max_gap, on_error=on_error, **kw
        )

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
