"""A table's snapshot: the immutable data files one version of a table holds.

:func:`resolve_table` reads a source the way its format says: one Parquet
object or a directory of them (Hive ``key=value`` segments as partition
columns), a Delta table (a directory holding ``_delta_log/``, through
``deltalake``), or an Iceberg table (a directory holding ``metadata/``, a
``*.metadata.json`` path, or a catalog table, through ``pyiceberg``). The
snapshot lists every data file with its size and partition values (and the
row count and column bounds the table's metadata records), so a caller can
check each location against ``allowed_roots`` and plan reads without a
request per file. ``deltalake`` and ``pyiceberg`` are imported only when a
table of theirs is resolved. Thread-safe (nothing shared is mutated).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from nexus_cache._lru import BoundedLRU
from nexus_cache._roots import location_allowed
from nexus_cache.errors import BackendUnavailableError, ConfigError

if TYPE_CHECKING:
    from nexus_cache.tables.filters import TableFilter

__all__ = [
    "CATALOG_SCHEME",
    "TABLE_KINDS",
    "DataFile",
    "TableSnapshot",
    "catalog_source",
    "resolve_table",
]

#: the URL scheme of an Iceberg catalog table: ``iceberg://<catalog>/<namespace>.<table>``
CATALOG_SCHEME = "iceberg://"

#: the table formats :func:`resolve_table` reads
TABLE_KINDS = ("parquet", "hive", "delta", "iceberg")


@dataclass(frozen=True)
class DataFile:
    """One immutable data file of a snapshot.

    ``path`` is a local path or a URL (with its protocol); ``partition`` the
    partition columns' values (``None`` for a null partition), typed as the
    snapshot's partition schema says; ``min_values`` / ``max_values`` bounds of
    columns the table's metadata records (a bound may be looser than the data,
    never tighter), and ``null_counts`` where known. ``etag``: the store's ETag
    from the listing of a Parquet or Hive directory on an object store (None
    for a local file, and for Delta and Iceberg data files, which their table
    never rewrites: path and size are their identity).
    """

    path: str
    size: int
    partition: tuple[tuple[str, Any], ...] = ()
    row_count: int | None = None
    min_values: tuple[tuple[str, Any], ...] = ()
    max_values: tuple[tuple[str, Any], ...] = ()
    null_counts: tuple[tuple[str, int], ...] = ()
    etag: str | None = None

    @property
    def partition_values(self) -> dict[str, Any]:
        return dict(self.partition)


#: what one snapshot's :attr:`~TableSnapshot.derived` keeps at most
_DERIVED = 16


@dataclass(frozen=True)
class TableSnapshot:
    """The data files of one version of a table, and the schema to read them with.

    ``kind`` is one of :data:`TABLE_KINDS`; ``version`` the Delta version or the
    Iceberg snapshot id (None for Parquet and Hive data); ``schema`` the
    table's columns, partition columns included (Iceberg fields keep their
    ``PARQUET:field_id`` metadata, so a renamed or added column maps to each
    file by id); ``partition_schema`` the partition columns and their types.
    ``filesystem`` is the fsspec filesystem of remote files (None: local).

    A local Hive directory resolved with a filter lists only the partition
    directories the filter may need: ``partitions_skipped`` counts those it did
    not enter (their files are not in ``files``), ``pruned_with`` is that
    filter, canonical (None: every data file is listed).
    """

    kind: str
    location: str
    version: int | None
    schema: pa.Schema
    partition_schema: pa.Schema
    files: tuple[DataFile, ...]
    filesystem: Any = field(default=None, compare=False, repr=False)
    partitions_skipped: int = 0
    pruned_with: TableFilter | None = field(default=None, compare=False, repr=False)

    @functools.cached_property
    def derived(self) -> BoundedLRU[Any, Any]:
        """A small memory of what pure functions of this snapshot gave (a reader's
        pruning by filter, say), kept as long as the snapshot and no longer: a
        snapshot never changes, so what it gave once holds while it lives."""
        return BoundedLRU(_DERIVED)

    @property
    def locations(self) -> tuple[str, ...]:
        """Every data file's location, to check against ``allowed_roots``."""
        return tuple(f.path for f in self.files)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def files_outside(self) -> tuple[str, ...]:
        """Data files the table's metadata places outside the table's own location
        (a Delta log or Iceberg metadata may name any path): each needs its own
        ``allowed_roots`` check."""
        root = (self.location,) if self.kind in ("delta", "iceberg", "hive") else ()
        return tuple(p for p in self.locations if not location_allowed(p, root))

    def missing_file(self, path: str) -> FileNotFoundError:
        """The error for a data file of this snapshot that does not exist (removed by
        a vacuum or snapshot expiry, or by hand): it names the file, the table and
        its version, and says what to do."""
        return FileNotFoundError(
            f"{path!r} (a data file of table {self.location!r}, version "
            f"{self.version}) does not exist; the snapshot may have expired: resolve "
            "the table again, or restore the file"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON summary for diagnostics and evidence."""
        return {
            "kind": self.kind,
            "location": self.location,
            "version": self.version,
            "files": len(self.files),
            "bytes": self.total_bytes,
            "partition_columns": self.partition_schema.names,
        }


def resolve_table(
    source: str,
    as_of: int | None = None,
    *,
    storage_options: Mapping[str, Any] | None = None,
    catalog: str | Mapping[str, Any] | None = None,
    filter: Any = None,
    allowed_roots: Sequence[str] | None = None,
) -> TableSnapshot:
    """The snapshot ``source`` names (its latest version, or ``as_of``).

    ``source`` is a local path or an fsspec URL: a Parquet object, a directory
    of them (Hive partitions read from ``key=value`` segments), a Delta table,
    an Iceberg table directory or a ``*.metadata.json``. With ``catalog`` (a
    catalog name, or its properties as ``pyiceberg.catalog.load_catalog``
    reads them, ``name`` included), ``source`` is an Iceberg table identifier
    (``namespace.table``). ``iceberg://<catalog>/<namespace>.<table>`` names
    a catalog table too (see :func:`catalog_source`). ``as_of`` is a Delta
    version or an Iceberg snapshot id; Parquet and Hive data have no versions.

    ``filter`` (pyarrow's ``filters`` convention) lets a local Hive directory's
    listing skip the partition directories it rules out (see
    :attr:`TableSnapshot.partitions_skipped`); other tables ignore it here.

    With ``allowed_roots``, an Iceberg table's manifest list and manifests must
    lie under them (:class:`ConfigError` naming the first outside, before it is
    read); the data files are the caller's to check (:attr:`TableSnapshot.locations`).
    """
    named = catalog_source(source) if catalog is None else None
    if named is not None:
        catalog, source = named
    if catalog is not None:
        from nexus_cache.tables._iceberg import resolve_catalog_table

        return resolve_catalog_table(source, catalog, as_of, allowed_roots)
    from nexus_cache.lakehouse import resolve_source

    options = None if storage_options is None else dict(storage_options)
    try:
        fs, path = resolve_source(source, None, options)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"source {source!r} needs a package that is not installed ({exc}); install it"
        ) from exc
    if fs is None:
        import os

        path = os.path.abspath(os.path.expanduser(path))
        local = _local_fs()
        kind = _detect_local(path)
    else:
        local = fs
        kind = _detect(local, path)
    if kind == "delta":
        from nexus_cache.tables._delta import resolve_delta

        return resolve_delta(source, fs, path, as_of, options)
    if kind == "iceberg":
        from nexus_cache.tables._iceberg import resolve_iceberg

        return resolve_iceberg(source, fs, local, path, as_of, options, allowed_roots)
    if as_of is not None:
        raise ConfigError(
            f"as_of={as_of!r}: source {source!r} is Parquet data, which has no versions; "
            "drop as_of, or name a Delta or Iceberg table"
        )
    from nexus_cache.tables._hive import resolve_hive

    return resolve_hive(source, fs, local, path, filter)


def catalog_source(source: str) -> tuple[str, str] | None:
    """``(catalog, identifier)`` of an ``iceberg://<catalog>/<namespace>.<table>``
    source (the catalog configured as ``pyiceberg.catalog.load_catalog`` reads it:
    ``.pyiceberg.yaml`` or ``PYICEBERG_CATALOG__<NAME>__...`` variables), None for
    any other source; :class:`ConfigError` for a malformed one."""
    text = source.strip()
    if not text.lower().startswith(CATALOG_SCHEME):
        return None
    name, _, identifier = text[len(CATALOG_SCHEME) :].partition("/")
    identifier = identifier.strip("/")
    if not name or "." not in identifier or "/" in identifier:
        raise ConfigError(
            f"source {source!r}: an Iceberg catalog table is named "
            "iceberg://<catalog>/<namespace>.<table>, e.g. iceberg://prod/sales.orders"
        )
    return name, identifier


@functools.cache
def _local_fs() -> Any:
    """fsspec's local filesystem (one instance: it holds no state of a path)."""
    import fsspec

    return fsspec.filesystem("file")


def _detect_local(path: str) -> str:
    """:func:`_detect` of a local path, asked of the operating system directly (what
    fsspec's local filesystem asks it, without its layers)."""
    import os

    base = path.rstrip("/") or path
    if base.endswith(".metadata.json"):
        return "iceberg"
    if not os.path.isdir(base):
        return "parquet"
    if os.path.isdir(os.path.join(base, "_delta_log")):
        return "delta"
    metadata = os.path.join(base, "metadata")
    if os.path.isdir(metadata):
        if os.path.exists(os.path.join(metadata, "version-hint.text")):
            return "iceberg"
        try:
            names = os.listdir(metadata)
        except OSError:
            names = []
        if any(n.endswith(".metadata.json") for n in names):
            return "iceberg"
    return "hive"


def _detect(fs: Any, path: str) -> str:
    base = path.rstrip("/")
    if base.endswith(".metadata.json"):
        return "iceberg"
    try:
        is_dir = fs.isdir(base)
    except (OSError, ValueError):
        return "parquet"
    if not is_dir:
        return "parquet"
    if fs.isdir(f"{base}/_delta_log"):
        return "delta"
    if fs.isdir(f"{base}/metadata") and (
        fs.exists(f"{base}/metadata/version-hint.text")
        or any(str(p).endswith(".metadata.json") for p in fs.ls(f"{base}/metadata", detail=False))
    ):
        return "iceberg"
    return "hive"
