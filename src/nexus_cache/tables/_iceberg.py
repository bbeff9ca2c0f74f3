"""An Iceberg table's snapshot, through ``pyiceberg`` (the ``iceberg`` extra).

The table comes from a directory holding ``metadata/`` (the version
``version-hint.text`` names, else the newest ``*.metadata.json``), from a
metadata JSON path, or from a catalog (``pyiceberg.catalog.load_catalog``).
The data files of the current snapshot (or ``as_of``) come from its
manifests, with sizes, identity partition values, row counts and column
bounds. Delete files (position or equality deletes) are refused, naming
them: the rows they delete are still in the data files. The schema is the
snapshot's, each field keeping its Iceberg field id, so a column added later
reads as null in older files and a renamed one still maps to its data.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from nexus_cache._roots import check_listed
from nexus_cache.errors import BackendUnavailableError, ConfigError, SourceFormatError
from nexus_cache.tables._said import said
from nexus_cache.tables.snapshot import DataFile, TableSnapshot

__all__ = ["resolve_catalog_table", "resolve_iceberg"]

_VERSION = re.compile(r"^v?(\d+)[-.]")
_BOUND_TYPES = ("int", "long", "float", "double", "string", "boolean", "date", "timestamp")


def _pyiceberg(source: str) -> None:
    try:
        import pyiceberg  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailableError(
            f"source {source!r} is an Iceberg table; reading it needs the pyiceberg "
            "package: pip install 'nexus-cache[iceberg]'"
        ) from exc


def resolve_iceberg(
    source: str,
    fs: Any,
    listing_fs: Any,
    path: str,
    as_of: int | None,
    storage_options: Mapping[str, Any] | None,
    allowed_roots: Sequence[str] | None = None,
) -> TableSnapshot:
    _pyiceberg(source)
    from pyiceberg.table import StaticTable

    metadata = (
        path if path.endswith(".metadata.json") else _newest_metadata(source, listing_fs, path)
    )
    location = metadata if fs is None else fs.unstrip_protocol(metadata)
    try:
        table = StaticTable.from_metadata(location, properties=dict(storage_options or {}))
    except Exception as exc:  # pyiceberg raises JSON, validation and IO errors alike
        raise SourceFormatError(
            f"Iceberg table {source!r}: its metadata {metadata!r} cannot be read "
            f"({type(exc).__name__}: {said(exc)}); check the file (corrupt or truncated)"
        ) from exc
    return _snapshot(source, table, fs, as_of, allowed_roots=allowed_roots)


def resolve_catalog_table(
    identifier: str,
    catalog: str | Mapping[str, Any],
    as_of: int | None,
    allowed_roots: Sequence[str] | None = None,
) -> TableSnapshot:
    _pyiceberg(identifier)
    from pyiceberg.catalog import load_catalog

    if isinstance(catalog, str):
        name, properties = catalog, {}
    else:
        properties = {str(k): v for k, v in catalog.items() if k != "name"}
        name = str(catalog.get("name", "default"))
    try:
        loaded = load_catalog(name, **properties)
        table = loaded.load_table(identifier)
    except Exception as exc:
        raise ConfigError(
            f"Iceberg table {identifier!r} in catalog {name!r} cannot be loaded "
            f"({type(exc).__name__}: {said(exc)}); check the catalog's configuration "
            "and the table's name (namespace.table)"
        ) from exc
    location = str(table.metadata.location)
    fs = None
    if "://" in location and not location.startswith("file://"):
        import fsspec

        fs = fsspec.core.url_to_fs(location)[0]
    return _snapshot(identifier, table, fs, as_of, location, allowed_roots)


def _newest_metadata(source: str, fs: Any, path: str) -> str:
    base = f"{path.rstrip('/')}/metadata"
    hint = f"{base}/version-hint.text"
    names = [str(p) for p in fs.ls(base, detail=False) if str(p).endswith(".metadata.json")]
    if fs.exists(hint):
        with fs.open(hint, "rb") as handle:
            text = handle.read(256).decode("utf-8", "replace").strip()
        wanted = [n for n in names if n.rsplit("/", 1)[-1] in (f"v{text}.metadata.json", text)]
        wanted += [n for n in names if _version(n) == text.lstrip("v")]
        if not wanted:
            raise SourceFormatError(
                f"Iceberg table {source!r}: {hint} names version {text!r}, which no "
                "metadata file holds; fix version-hint.text or remove it"
            )
        return wanted[0]
    if not names:
        raise SourceFormatError(f"Iceberg table {source!r}: {base} holds no *.metadata.json")
    return max(names, key=lambda n: (int(_version(n) or -1), n))


def _version(name: str) -> str | None:
    found = _VERSION.match(name.rsplit("/", 1)[-1])
    return found.group(1) if found else None


def _snapshot(
    source: str,
    table: Any,
    fs: Any,
    as_of: int | None,
    location: str | None = None,
    allowed_roots: Sequence[str] | None = None,
) -> TableSnapshot:
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.transforms import IdentityTransform

    if as_of is not None:
        if isinstance(as_of, bool) or not isinstance(as_of, int):
            raise ConfigError(f"as_of={as_of!r}: an Iceberg snapshot id is an integer")
        if table.metadata.snapshot_by_id(as_of) is None:
            known = ", ".join(str(s.snapshot_id) for s in table.metadata.snapshots[-10:])
            raise ConfigError(
                f"as_of={as_of}: Iceberg table {source!r} has no such snapshot (its latest: "
                f"{known or 'none'}); name an existing snapshot id"
            )
    if allowed_roots is not None:
        _check_manifests(location or source, table, as_of, allowed_roots)
    try:
        scan = table.scan(snapshot_id=as_of)
        iceberg_schema = scan.projection()
        tasks = list(scan.plan_files())
    except Exception as exc:
        raise SourceFormatError(
            f"Iceberg table {source!r}: its manifests cannot be read "
            f"({type(exc).__name__}: {said(exc)}); check the metadata directory"
        ) from exc
    schema = schema_to_pyarrow(iceberg_schema, include_field_ids=True)
    schema = pa.schema([_plain(f) for f in schema])
    spec = table.metadata.spec()
    identity = [
        (i, iceberg_schema.find_field(pf.source_id).name)
        for i, pf in enumerate(spec.fields)
        if isinstance(pf.transform, IdentityTransform)
    ]
    partition_schema = pa.schema([schema.field(name) for _, name in identity])
    deletes = sorted({d.file_path for task in tasks for d in task.delete_files})
    if deletes:
        shown = ", ".join(deletes[:3]) + (
            f" and {len(deletes) - 3} more" if len(deletes) > 3 else ""
        )
        raise SourceFormatError(
            f"Iceberg table {source!r} has delete files ({shown}), which are not supported: "
            "the rows they delete are still in the data files; rewrite the table's data "
            "files (rewrite_data_files) or read it with copy-on-write deletes"
        )
    files = tuple(
        _data_file(task.file, fs, identity, spec.spec_id, iceberg_schema) for task in tasks
    )
    snapshot = (
        table.metadata.snapshot_by_id(as_of) if as_of is not None else table.current_snapshot()
    )
    return TableSnapshot(
        kind="iceberg",
        location=location or source,
        version=None if snapshot is None else int(snapshot.snapshot_id),
        schema=schema,
        partition_schema=partition_schema,
        files=files,
        filesystem=fs,
    )


def _check_manifests(
    source: str, table: Any, as_of: int | None, allowed_roots: Sequence[str]
) -> None:
    """Refuse the snapshot unless its manifest list, then each manifest it lists, lies
    under ``allowed_roots``, each checked before it is read (metadata may name any
    path, as it may for data files)."""
    snapshot = (
        table.metadata.snapshot_by_id(as_of) if as_of is not None else table.current_snapshot()
    )
    if snapshot is None:
        return
    check_listed(source, (str(snapshot.manifest_list),), allowed_roots)
    try:
        manifests = snapshot.manifests(table.io)
    except Exception as exc:
        raise SourceFormatError(
            f"Iceberg table {source!r}: its manifest list cannot be read "
            f"({type(exc).__name__}: {said(exc)}); check the metadata directory"
        ) from exc
    check_listed(source, tuple(str(m.manifest_path) for m in manifests), allowed_roots)


def _plain(f: pa.Field) -> pa.Field:
    if pa.types.is_large_string(f.type):
        return pa.field(f.name, pa.string(), f.nullable, f.metadata)
    if pa.types.is_large_binary(f.type):
        return pa.field(f.name, pa.binary(), f.nullable, f.metadata)
    return f


def _data_file(
    data: Any, fs: Any, identity: list[tuple[int, str]], spec_id: int, iceberg_schema: Any
) -> DataFile:
    from pyiceberg.conversions import from_bytes

    path = str(data.file_path)
    if fs is None:
        path = path.removeprefix("file://")
    same_spec = getattr(data, "spec_id", spec_id) == spec_id
    # a file written under an older partition spec keeps no values for this one
    partition = tuple((name, data.partition[i]) for i, name in identity) if same_spec else ()
    mins, maxs, nulls = [], [], []
    for field_id, low in (data.lower_bounds or {}).items():
        high = (data.upper_bounds or {}).get(field_id)
        try:
            f = iceberg_schema.find_field(field_id)
        except ValueError:
            continue  # a column dropped since
        if high is None or str(f.field_type) not in _BOUND_TYPES:
            continue
        mins.append((f.name, from_bytes(f.field_type, low)))
        maxs.append((f.name, from_bytes(f.field_type, high)))
    for field_id, count in (data.null_value_counts or {}).items():
        try:
            nulls.append((iceberg_schema.find_field(field_id).name, int(count)))
        except ValueError:
            continue
    return DataFile(
        path=path,
        size=int(data.file_size_in_bytes),
        partition=partition,
        row_count=int(data.record_count),
        min_values=tuple(mins),
        max_values=tuple(maxs),
        null_counts=tuple(nulls),
    )
