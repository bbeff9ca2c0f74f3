"""Parquet objects and Hive-partitioned directories as a snapshot.

One listing finds every ``*.parquet`` object under the directory with its
size (and, on an object store, its ETag); hidden and ``_``-prefixed files
and directories are skipped (metadata, or a writer's uncommitted
``_temporary/``; :func:`hidden_path`, the one rule every listing of the
package and the service uses). A local symbolic link to a file is listed
like the file (its target's size): the caller checks every location
against its ``allowed_roots`` after resolving links. ``key=value``
directory segments become partition columns, typed as
``pyarrow.dataset.partitioning(flavor="hive")`` infers them: ``int32`` when
every value is a 32-bit integer, else ``string``;
``__HIVE_DEFAULT_PARTITION__`` is a null; values are URI-decoded. The schema
is the first object's, with the partition columns after its own.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache.errors import ConfigError, SourceFormatError
from nexus_cache.tables.snapshot import DataFile, TableSnapshot

__all__ = ["hidden_path", "resolve_hive"]

#: the partition value Hive writes for a null
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_INT32 = (-(1 << 31), (1 << 31) - 1)


def hidden_path(relative: str) -> bool:
    """Whether a file or a directory on ``relative`` (a path under the source) is
    named ``_...`` or ``....``: metadata, or work in progress (``_temporary/`` of
    a writer that has not committed)."""
    return any(
        part.startswith((".", "_")) for part in relative.replace(os.sep, "/").split("/") if part
    )


def _listed_file(name: str, info: dict[str, Any]) -> bool:
    """A file of a listing, or a local symbolic link to one (fsspec lists a link
    as ``other``; its size is the target's)."""
    kind = info.get("type", "file")
    link = kind == "other" and bool(info.get("islink"))
    return kind == "file" or (link and os.path.isfile(name))


def _local_parquet(base: str) -> list[tuple[str, int]]:
    """``(path, size)`` of every ``*.parquet`` file under local directory ``base``,
    as the fsspec listing finds them: a file, or a symbolic link to one (its
    target's size); directories behind links are not entered, hidden and
    ``_``-prefixed entries are skipped, a directory that cannot be read (or
    an entry that vanished) is left out. One ``os.scandir`` per directory,
    one stat per file."""
    found: list[tuple[str, int]] = []
    pending = [base]
    while pending:
        directory = pending.pop()
        try:
            with os.scandir(directory) as listing:
                entries = list(listing)
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith((".", "_")):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif entry.name.endswith(".parquet") and entry.is_file():
                    found.append((entry.path, entry.stat().st_size))
            except OSError:  # vanished, or a dangling link
                continue
    return found


def resolve_hive(source: str, fs: Any, listing_fs: Any, path: str) -> TableSnapshot:
    base = path.rstrip("/") or path
    try:
        is_dir = listing_fs.isdir(base)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"source {source!r} cannot be listed ({exc}); check the path") from exc
    entries: list[tuple[str, int, str | None]]
    if is_dir and fs is None:  # local: one scandir per directory, hidden ones not entered
        entries = sorted((name, size, None) for name, size in _local_parquet(base))
    elif is_dir:
        found = listing_fs.find(base, detail=True)
        entries = sorted(
            (name, int(info.get("size") or 0), _etag(info))
            for name, info in found.items()
            if _listed_file(name, info)
            and name.endswith(".parquet")
            and not hidden_path(name[len(base) :])
        )
    else:
        try:
            info = listing_fs.info(base)
        except FileNotFoundError:
            raise FileNotFoundError(f"source {source!r} does not exist; check the path") from None
        entries = [(base, int(info.get("size") or 0), _etag(info))]
    if not entries:
        raise ConfigError(f"source {source!r} holds no .parquet object; point it at Parquet data")
    segments = [_segments(name[len(base) :]) if is_dir else [] for name, _, _ in entries]
    keys: list[str] = []
    for pairs in segments:
        for key, _ in pairs:
            if key not in keys:
                keys.append(key)
    types = {key: _infer([dict(p).get(key) for p in segments]) for key in keys}
    first = entries[0][0]
    try:
        data_schema = _read_schema(first, fs)
    except (pa.ArrowInvalid, OSError) as exc:
        raise SourceFormatError(
            f"{first!r} (in source {source!r}) is not readable Parquet ({exc}); remove it "
            "or point the query at Parquet data"
        ) from exc
    partition_fields = [pa.field(k, types[k]) for k in keys if data_schema.get_field_index(k) < 0]
    typed: dict[tuple[tuple[str, str | None], ...], tuple[tuple[str, Any], ...]] = {}
    files = []
    for (name, size, etag), pairs in zip(entries, segments, strict=True):
        segment_key = tuple(pairs)
        partition = typed.get(segment_key)
        if partition is None:  # typed once per distinct partition directory
            values = dict(pairs)
            partition = tuple(
                (f.name, _typed(values.get(f.name), f.type)) for f in partition_fields
            )
            typed[segment_key] = partition
        files.append(
            DataFile(
                path=name if fs is None else fs.unstrip_protocol(name),
                size=size,
                partition=partition,
                etag=etag if fs is not None else None,
            )
        )
    partition_schema = pa.schema(partition_fields)
    schema = pa.schema(list(data_schema) + partition_fields)
    return TableSnapshot(
        kind="hive" if partition_fields else "parquet",
        location=source,
        version=None,
        schema=schema,
        partition_schema=partition_schema,
        files=tuple(files),
        filesystem=fs,
    )


def _etag(info: dict[str, Any]) -> str | None:
    """The ETag an object store's listing gives an object (None: none)."""
    value = info.get("ETag") or info.get("etag")
    return str(value) if value else None


def _read_schema(name: str, fs: Any) -> pa.Schema:
    if fs is None:
        return pq.read_schema(name)
    with fs.open(name, "rb") as handle:
        return pq.read_schema(handle)


def _segments(relative: str) -> list[tuple[str, str | None]]:
    """The ``key=value`` directory segments of a relative object path."""
    out = []
    for part in relative.strip("/").split("/")[:-1]:
        key, sep, value = part.partition("=")
        if sep and key:
            decoded = unquote(value)
            out.append((unquote(key), None if decoded == NULL_PARTITION else decoded))
    return out


def _is_int32(text: str) -> bool:
    body = text[1:] if text[:1] in "+-" else text
    return bool(body) and body.isascii() and body.isdigit() and _INT32[0] <= int(text) <= _INT32[1]


def _infer(values: list[str | None]) -> pa.DataType:
    present = [v for v in values if v is not None]
    if present and all(_is_int32(v) for v in present):
        return pa.int32()
    return pa.string()


def _typed(value: str | None, arrow_type: pa.DataType) -> Any:
    if value is None:
        return None
    return int(value) if pa.types.is_integer(arrow_type) else value
