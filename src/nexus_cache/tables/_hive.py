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
every value is a 32-bit integer as Arrow casts text (:func:`_int32`), else
``string``;
``__HIVE_DEFAULT_PARTITION__`` is a null; values are URI-decoded. The schema
is the first object's, with the partition columns after its own.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache._lru import BoundedLRU
from nexus_cache.errors import ConfigError, SourceFormatError
from nexus_cache.tables.snapshot import DataFile, TableSnapshot

__all__ = ["hidden_path", "resolve_hive"]

#: the partition value Hive writes for a null
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_INT32 = (-(1 << 31), (1 << 31) - 1)
_HEX = frozenset("0123456789abcdefABCDEF")

#: one object's ``key=value`` directory segments, in path order
_Pairs = tuple[tuple[str, str | None], ...]
#: a partition schema as its typing needs it: each column's name, and whether it is
#: an integer column (:func:`_partition_shape`)
_Shape = tuple[tuple[str, bool], ...]

#: a local object's seconds since its last change from which its schema is kept: a
#: write within the same tick of the filesystem's clock leaves size, mtime and inode
#: as they were, so only a file older than that is known by them
_SETTLED_S = 1.0
#: the schemas of local first objects by ``(path, device, inode, size, mtime_ns)``:
#: a repeated query of a table does not read its first object's footer again while
#: that stat says it is the file read before
_SCHEMAS: BoundedLRU[tuple[str, int, int, int, int], pa.Schema] = BoundedLRU(256)


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


def _scan_dir(directory: str) -> tuple[list[os.DirEntry[str]], list[os.DirEntry[str]]]:
    """``(files, directories)`` of one local directory, one ``os.scandir``: the
    ``*.parquet`` files (or symbolic links to files) and the directories (not
    behind links), hidden and ``_``-prefixed entries skipped; a directory that
    cannot be read, or an entry that vanished, is left out. Nothing is stat'ed
    but a link."""
    files, dirs, _ = _listing(directory)
    return files, dirs


def _listing(
    directory: str,
) -> tuple[list[os.DirEntry[str]], list[os.DirEntry[str]], bool]:
    """:func:`_scan_dir`, and whether the listing depends on more than the
    directory's own entries: a ``*.parquet`` name that is a symbolic link (its
    target, not the directory, decides whether it is listed), or an entry that
    vanished while it was listed."""
    files: list[os.DirEntry[str]] = []
    dirs: list[os.DirEntry[str]] = []
    volatile = False
    try:
        with os.scandir(directory) as listing:
            entries = list(listing)
    except OSError:
        return files, dirs, volatile
    for entry in entries:
        if entry.name.startswith((".", "_")):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                dirs.append(entry)
            elif entry.name.endswith(".parquet"):
                volatile = volatile or entry.is_symlink()
                if entry.is_file():
                    files.append(entry)
        except OSError:  # vanished, or a dangling link
            volatile = True
            continue
    return files, dirs, volatile


def _sized(files: list[os.DirEntry[str]]) -> list[tuple[str, int]]:
    """``(path, size)`` of listed files, one stat each (a link: its target's size);
    a file that vanished is left out."""
    out = []
    for entry in files:
        try:
            out.append((entry.path, entry.stat().st_size))
        except OSError:
            continue
    return out


def _local_parquet(base: str) -> list[tuple[str, int]]:
    """``(path, size)`` of every ``*.parquet`` file under local directory ``base``,
    as the fsspec listing finds them (:func:`_scan_dir` in every directory, one
    stat per file)."""
    found: list[tuple[str, int]] = []
    pending = [base]
    while pending:
        files, dirs = _scan_dir(pending.pop())
        found.extend(_sized(files))
        pending.extend(d.path for d in dirs)
    return found


def resolve_hive(
    source: str, fs: Any, listing_fs: Any, path: str, filter: Any = None
) -> TableSnapshot:
    base = path.rstrip("/") or path
    try:
        is_dir = os.path.isdir(base) if fs is None else listing_fs.isdir(base)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"source {source!r} cannot be listed ({exc}); check the path") from exc
    if is_dir and fs is None and filter is not None:
        from nexus_cache.tables._hive_pruned import resolve_pruned

        pruned = resolve_pruned(source, base, filter)
        if pruned is not None:
            return pruned
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
    segments = [_segments(name[len(base) :], base) if is_dir else () for name, _, _ in entries]
    partition_fields, schema = _table_schema(source, entries[0][0], fs, _partition_types(segments))
    return TableSnapshot(
        kind="hive" if partition_fields else "parquet",
        location=source,
        version=None,
        schema=schema,
        partition_schema=pa.schema(partition_fields),
        files=_data_files(entries, segments, partition_fields, fs),
        filesystem=fs,
    )


def _partition_types(segments: Sequence[_Pairs]) -> dict[str, pa.DataType]:
    """Each partition key (in order of first appearance) and its type, inferred from
    the ``key=value`` segments of every object's path."""
    return dict(_types_of(tuple(segments)))


@functools.lru_cache(maxsize=64)
def _types_of(segments: tuple[_Pairs, ...]) -> tuple[tuple[str, pa.DataType], ...]:
    """:func:`_partition_types`, remembered: a pure function of the names, which a
    repeated listing of the same table gives again."""
    keys: dict[str, list[str | None]] = {}
    for pairs in segments:
        for key, _ in pairs:
            keys.setdefault(key, [])
    for pairs in segments:
        values = dict(pairs)
        for key, found in keys.items():
            found.append(values.get(key))
    return tuple((key, _infer(values)) for key, values in keys.items())


def _table_schema(
    source: str, first: str, fs: Any, types: dict[str, pa.DataType]
) -> tuple[list[pa.Field], pa.Schema]:
    """``(partition fields, table schema)``: the schema of object ``first`` with the
    partition columns it does not hold after its own."""
    return _with_partitions(_data_schema(source, first, fs), types)


def _data_schema(source: str, first: str, fs: Any) -> pa.Schema:
    """The schema of object ``first`` of ``source`` (:func:`_read_schema`);
    :class:`SourceFormatError` naming it when it is not readable Parquet."""
    try:
        return _read_schema(first, fs)
    except (pa.ArrowInvalid, OSError) as exc:
        raise SourceFormatError(
            f"{first!r} (in source {source!r}) is not readable Parquet ({exc}); remove it "
            "or point the query at Parquet data"
        ) from exc


def _with_partitions(
    data_schema: pa.Schema, types: dict[str, pa.DataType]
) -> tuple[list[pa.Field], pa.Schema]:
    """:func:`_table_schema` of a first object's ``data_schema``."""
    fields = [pa.field(k, t) for k, t in types.items() if data_schema.get_field_index(k) < 0]
    return fields, pa.schema(list(data_schema) + fields)


def _data_files(
    entries: list[tuple[str, int, str | None]],
    segments: list[_Pairs],
    partition_fields: list[pa.Field],
    fs: Any,
) -> tuple[DataFile, ...]:
    shape = _partition_shape(partition_fields)
    files = []
    for (name, size, etag), pairs in zip(entries, segments, strict=True):
        partition = _typed_partition(pairs, shape)
        files.append(
            DataFile(
                path=name if fs is None else fs.unstrip_protocol(name),
                size=size,
                partition=partition,
                etag=etag if fs is not None else None,
            )
        )
    return tuple(files)


def _partition_shape(partition_fields: Sequence[pa.Field]) -> _Shape:
    """What typing a partition's values needs of the partition columns."""
    return tuple((f.name, pa.types.is_integer(f.type)) for f in partition_fields)


@functools.lru_cache(maxsize=1 << 16)
def _typed_partition(pairs: _Pairs, shape: _Shape) -> tuple[tuple[str, Any], ...]:
    """The values of one object's segments typed as the partition columns say (a
    column the path lacks: None); remembered, as a repeated listing names the same
    directories again."""
    values = dict(pairs)
    return tuple((name, _typed(values.get(name), integer)) for name, integer in shape)


def _etag(info: dict[str, Any]) -> str | None:
    """The ETag an object store's listing gives an object (None: none)."""
    value = info.get("ETag") or info.get("etag")
    return str(value) if value else None


def _read_schema(name: str, fs: Any) -> pa.Schema:
    """The schema of object ``name``; a local file's read again only when its stat
    differs from the one it was read with (or it changed within :data:`_SETTLED_S`
    before it was read)."""
    if fs is not None:
        with fs.open(name, "rb") as handle:
            return pq.read_schema(handle)
    st = os.stat(name)
    key = (name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    found = _SCHEMAS.get(key)
    if found is not None:
        return found
    schema = pq.read_schema(name)
    if time.time() - st.st_mtime_ns / 1e9 >= _SETTLED_S:
        _SCHEMAS.put(key, schema)
    return schema


def _segments(relative: str, base: str) -> _Pairs:
    """The ``key=value`` directory segments of an object's path relative to ``base``."""
    out = []
    parts = relative.strip("/").split("/")[:-1]
    for depth, part in enumerate(parts, 1):
        try:
            found = _segment(part)
        except UnicodeDecodeError:
            raise _undecodable("/".join([base.rstrip("/"), *parts[:depth]])) from None
        if found is not None:
            out.append(found)
    return tuple(out)


def _segment_at(name: str, path: str) -> tuple[str, str | None] | None:
    """:func:`_segment` of the directory ``name`` at ``path``."""
    try:
        return _segment(name)
    except UnicodeDecodeError:
        raise _undecodable(path) from None


def _undecodable(path: str) -> SourceFormatError:
    """The error for a partition directory whose name is not UTF-8 text once
    URI-decoded: pyarrow's partitioning refuses it too (decoded leniently, two such
    values would read as one)."""
    return SourceFormatError(
        f"partition directory {path!r} is not UTF-8 text once its %-escapes are "
        "decoded; rename it, writing its value as UTF-8 (e.g. %C3%A9 for é)"
    )


@functools.lru_cache(maxsize=1 << 16)
def _segment(name: str) -> tuple[str, str | None] | None:
    """``(key, value)`` of a ``key=value`` directory name (None: not one);
    :class:`UnicodeDecodeError` when a part is not UTF-8 text once URI-decoded."""
    key, sep, value = name.partition("=")
    if not (sep and key):
        return None
    decoded = unquote(value, errors="strict")
    return unquote(key, errors="strict"), None if decoded == NULL_PARTITION else decoded


@functools.lru_cache(maxsize=1 << 16)
def _int32(text: str) -> int | None:
    """The value of partition text ``text`` as an ``int32``, read as Arrow casts text
    to ``int32`` (the inference of ``pyarrow.dataset`` partitioning): ASCII decimal
    digits with an optional ``-`` (no ``+``), or ``0x`` and 1 to 8 hex digits (a bit
    pattern: ``0xFFFFFFFF`` is -1); None when it is not one."""
    if text[:2] in ("0x", "0X"):
        digits = text[2:]
        if not (0 < len(digits) <= 8 and all(c in _HEX for c in digits)):
            return None
        value = int(digits, 16)
        return value - (1 << 32) if value > _INT32[1] else value
    body = text[1:] if text[:1] == "-" else text
    if not (body and body.isascii() and body.isdigit()):
        return None
    value = int(text)
    return value if _INT32[0] <= value <= _INT32[1] else None


def _is_int32(text: str) -> bool:
    return _int32(text) is not None


def _infer(values: list[str | None]) -> pa.DataType:
    present = [v for v in values if v is not None]
    if present and all(_is_int32(v) for v in present):
        return pa.int32()
    return pa.string()


def _typed(value: str | None, integer: bool) -> Any:
    if value is None:
        return None
    return _int32(value) if integer else value
