"""A Delta table's snapshot, through ``deltalake`` (the ``delta`` extra).

The data files of the latest version (or ``as_of``) come from the log's add
actions, with their sizes, typed partition values, row counts and column
bounds. A table whose protocol needs a reader feature this reader does not
apply is refused, naming it: deletion vectors (rows the data files still hold
are deleted) and column mapping (a file's column names are not the table's)
would otherwise give wrong rows silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.types as pat

from nexus_cache.errors import BackendUnavailableError, ConfigError, SourceFormatError
from nexus_cache.tables._delta_snapshots import DELTA_SNAPSHOTS, log_state, options_identity
from nexus_cache.tables._said import said
from nexus_cache.tables.snapshot import DataFile, TableSnapshot

__all__ = ["SUPPORTED_READER_FEATURES", "resolve_delta"]

#: Delta reader features whose tables read correctly as plain Parquet files
SUPPORTED_READER_FEATURES = frozenset(
    {"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck", "typeWidening", "typeWidening-preview"}
)

#: the largest Delta version (the protocol's versions are signed 64-bit integers)
_LAST_VERSION = (1 << 63) - 1

_FEATURE_HINTS = {
    "deletionVectors": (
        "rows deleted by a deletion vector are still in the data files; rewrite the "
        "table without them (OPTIMIZE ... PURGE / REORG TABLE ... APPLY (PURGE)) and "
        "disable delta.enableDeletionVectors"
    ),
    "columnMapping": (
        "the data files name columns by physical ids; rewrite the table with "
        "delta.columnMapping.mode = 'none'"
    ),
}


def resolve_delta(
    source: str,
    fs: Any,
    path: str,
    as_of: int | None,
    storage_options: Mapping[str, Any] | None,
) -> TableSnapshot:
    try:
        from deltalake import DeltaTable
    except ImportError as exc:
        raise BackendUnavailableError(
            f"source {source!r} is a Delta table; reading it needs the deltalake package: "
            "pip install 'nexus-cache[delta]'"
        ) from exc
    if as_of is not None and (
        isinstance(as_of, bool) or not isinstance(as_of, int) or not 0 <= as_of <= _LAST_VERSION
    ):
        raise ConfigError(
            f"as_of={as_of!r}: a Delta version is an integer from 0 to {_LAST_VERSION}; name "
            "an existing version"
        )
    uri = path if fs is None else fs.unstrip_protocol(path)
    options = {str(k): str(v) for k, v in (storage_options or {}).items()} or None
    state = log_state(fs, path)  # one listing of the log: None on any doubt
    if state is None:  # the listing cannot bound as_of: the log's latest version does
        return _load(DeltaTable, source, fs, uri, as_of, options, bound=True)
    if as_of is not None and as_of > state.latest:  # deltalake walks every version up to it
        raise _beyond_latest(as_of, source, state.latest)
    version = state.latest if as_of is None else as_of
    stamp = state.stamp(version)
    key = (uri, options_identity(options), version)
    if stamp is not None:
        cached = DELTA_SNAPSHOTS.get(key, stamp)
        if cached is not None:  # the same commit file: the same version, unchanged
            return replace(cached, location=source, filesystem=fs)
    snapshot = _load(DeltaTable, source, fs, uri, as_of, options)
    if stamp is not None and snapshot.version == version:
        again = log_state(fs, path)  # the commit file did not change while it was read
        if again is not None and again.stamp(version) == stamp:
            DELTA_SNAPSHOTS.put(key, stamp, snapshot)
    return snapshot


def _beyond_latest(as_of: int, source: str, latest: int) -> ConfigError:
    return ConfigError(
        f"as_of={as_of}: Delta table {source!r} has no such version (its latest is "
        f"{latest}); name an existing version"
    )


def _load(
    delta_table: Any,
    source: str,
    fs: Any,
    uri: str,
    as_of: int | None,
    options: dict[str, str] | None,
    *,
    bound: bool = False,
) -> TableSnapshot:
    """The snapshot of version ``as_of`` (None: the latest), from the table's log.

    ``bound`` (an ``as_of`` no listing has bounded): the latest version is loaded
    first and a later ``as_of`` refused, since deltalake looks for a missing version
    by walking every version number up to it (minutes for a billion, hours beyond)."""
    try:
        if as_of is None or not bound:
            table = delta_table(uri, version=as_of, storage_options=options)
        else:
            table = delta_table(uri, storage_options=options)
            latest = table.version()
            if as_of > latest:
                raise _beyond_latest(as_of, source, latest)
            if as_of != latest:
                table.load_as_version(as_of)
    except ConfigError:
        raise
    except Exception as exc:  # deltalake raises its own classes (and OSError) for a bad log
        if as_of is not None and "version" in str(exc).lower():
            raise ConfigError(
                f"as_of={as_of}: Delta table {source!r} has no such version ({said(exc)}); name "
                "an existing version"
            ) from exc
        raise SourceFormatError(
            f"Delta table {source!r}: its log cannot be read ({type(exc).__name__}: "
            f"{said(exc)}); check the _delta_log directory (a corrupt or truncated commit file)"
        ) from exc
    _refuse_features(source, table)
    try:
        schema = pa.schema(table.schema().to_arrow())
        actions = pa.table(table.get_add_actions(flatten=True))
        uris = list(table.file_uris())
    except Exception as exc:
        raise SourceFormatError(
            f"Delta table {source!r}: its log cannot be read ({type(exc).__name__}: "
            f"{said(exc)}); check the _delta_log directory"
        ) from exc
    schema = pa.schema([_plain(f) for f in schema])
    partition_names = list(table.metadata().partition_columns)
    partition_schema = pa.schema([schema.field(n) for n in partition_names])
    if actions.num_rows != len(uris):
        raise SourceFormatError(
            f"Delta table {source!r}: the log lists {actions.num_rows} add actions but "
            f"{len(uris)} files; check the _delta_log directory"
        )
    paths = _column(actions, "path")
    locations = []
    for raw, file_uri in zip(paths, uris, strict=True):
        relative = unquote(unquote(str(raw)))
        if "://" in relative:  # an absolute URI, which deltalake's file list mangles
            file_uri = relative
        elif not unquote(file_uri).endswith(relative.lstrip("/")):
            raise SourceFormatError(
                f"Delta table {source!r}: file {file_uri!r} does not match its add action "
                f"{raw!r}; check the _delta_log directory"
            )
        locations.append(file_uri.removeprefix("file://") if fs is None else file_uri)
    return TableSnapshot(
        kind="delta",
        location=source,
        version=int(table.version()),
        schema=schema,
        partition_schema=partition_schema,
        files=_data_files(locations, actions, partition_schema, schema),
        filesystem=fs,
    )


def _plain(f: pa.Field) -> pa.Field:
    """Delta's Arrow schema without view types (string_view -> string)."""
    if pat.is_string_view(f.type) or pat.is_large_string(f.type):
        return pa.field(f.name, pa.string(), f.nullable, f.metadata)
    if pat.is_binary_view(f.type) or pat.is_large_binary(f.type):
        return pa.field(f.name, pa.binary(), f.nullable, f.metadata)
    return f


def _refuse_features(source: str, table: Any) -> None:
    protocol = table.protocol()
    features = list(protocol.reader_features or ())
    mode = str((table.metadata().configuration or {}).get("delta.columnMapping.mode", "none"))
    if mode.lower() != "none" and "columnMapping" not in features:
        features.append("columnMapping")
    for feature in features:
        if feature in SUPPORTED_READER_FEATURES:
            continue
        hint = _FEATURE_HINTS.get(feature, "this reader does not apply it")
        raise SourceFormatError(
            f"Delta table {source!r} uses the reader feature {feature!r}, which is not "
            f"supported: {hint}"
        )


def _column(actions: pa.Table, name: str) -> list[Any]:
    """Column ``name`` of the add actions as Python values (all None when absent)."""
    if name not in actions.column_names:
        return [None] * actions.num_rows
    return actions.column(name).to_pylist()


def _data_files(
    locations: list[str], actions: pa.Table, partition_schema: pa.Schema, schema: pa.Schema
) -> tuple[DataFile, ...]:
    """One :class:`DataFile` per add action, each column of the flattened actions
    converted to Python once (not row by row)."""
    partitions = [_column(actions, f"partition.{f.name}") for f in partition_schema]
    names = partition_schema.names
    bounded = [  # Delta truncates timestamp bounds to milliseconds: not bounds
        f.name for f in schema if f.name not in names and not pat.is_timestamp(f.type)
    ]
    lows = [_column(actions, f"min.{n}") for n in bounded]
    highs = [_column(actions, f"max.{n}") for n in bounded]
    nulls = [_column(actions, f"null_count.{n}") for n in bounded]
    sizes = _column(actions, "size_bytes")
    counts = _column(actions, "num_records")
    files = []
    for i, location in enumerate(locations):
        mins, maxs, null_counts = [], [], []
        for name, low, high, count in zip(bounded, lows, highs, nulls, strict=True):
            if low[i] is not None and high[i] is not None:
                mins.append((name, low[i]))
                maxs.append((name, high[i]))
            if count[i] is not None:
                null_counts.append((name, int(count[i])))
        files.append(
            DataFile(
                path=location,
                size=int(sizes[i]),
                partition=tuple(zip(names, (p[i] for p in partitions), strict=True)),
                row_count=None if counts[i] is None else int(counts[i]),
                min_values=tuple(mins),
                max_values=tuple(maxs),
                null_counts=tuple(null_counts),
            )
        )
    return tuple(files)
