"""fsspec filesystem ``nexus``: read any fsspec store through the lakehouse cache.

Two ways in::

    # URL chaining (pyarrow via fsspec, pandas, DuckDB's fsspec registration)
    fs, path = fsspec.core.url_to_fs("nexus::s3://bucket/key.parquet",
                                     s3={"anon": False}, nexus={"cache": cache})
    table = pyarrow.parquet.read_table(path, filesystem=fs)

    # wrapping a filesystem object
    fs = NexusCacheFileSystem(fs=s3fs.S3FileSystem(...), cache=cache)
    dataset = pyarrow.dataset.dataset("bucket/table/", filesystem=fs, format="parquet")

Listing and metadata calls go to the wrapped filesystem unchanged; ``open`` for
reading goes through :meth:`LakehouseCache.open` (plan, execute, diagnostics).
Without ``cache=`` the process-wide :func:`~.cache.default_cache` (configured from
the environment) is used. The filesystem is read-only. Importing this module
registers the ``nexus`` protocol with fsspec.
"""

from __future__ import annotations

from typing import Any

import fsspec
from fsspec.implementations.chained import ChainedFileSystem

from nexus_cache.lakehouse._cache import LakehouseCache, default_cache
from nexus_cache.lakehouse._reader import LakehouseFile

__all__ = ["NexusCacheFileSystem"]


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
        return self.cache.open(self._strip_protocol(path), fs=self.fs)

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kw: Any
    ) -> bytes:
        with self.open(path, "rb") as f:
            size = f.size
            lo = 0 if start is None else (start if start >= 0 else max(0, size + start))
            hi = size if end is None else (end if end >= 0 else max(0, size + end))
            f.seek(lo)
            return f.read(max(0, hi - lo))

    # -- metadata goes to the wrapped filesystem ---------------------------------
    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        return self.fs.ls(self._strip_protocol(path), detail=detail, **kwargs)

    def info(self, path: str, **kwargs: Any) -> Any:
        return self.fs.info(self._strip_protocol(path), **kwargs)

    def find(self, path: str, *args: Any, **kwargs: Any) -> Any:
        return self.fs.find(self._strip_protocol(path), *args, **kwargs)

    def glob(self, path: str, *args: Any, **kwargs: Any) -> Any:
        return self.fs.glob(self._strip_protocol(path), *args, **kwargs)

    def exists(self, path: str, **kwargs: Any) -> bool:
        return bool(self.fs.exists(self._strip_protocol(path), **kwargs))

    def isdir(self, path: str) -> bool:
        return bool(self.fs.isdir(self._strip_protocol(path)))

    def isfile(self, path: str) -> bool:
        return bool(self.fs.isfile(self._strip_protocol(path)))

    def size(self, path: str) -> Any:
        return self.fs.size(self._strip_protocol(path))

    def modified(self, path: str) -> Any:
        return self.fs.modified(self._strip_protocol(path))

    def ukey(self, path: str) -> Any:
        return self.fs.ukey(self._strip_protocol(path))

    def invalidate_cache(self, path: str | None = None) -> None:
        self.fs.invalidate_cache(path)

    def __repr__(self) -> str:
        return f"NexusCacheFileSystem(fs={self.fs!r}, cache={self.cache!r})"


fsspec.register_implementation("nexus", NexusCacheFileSystem, clobber=True)
