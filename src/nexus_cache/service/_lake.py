"""The service's lakehouse step: resolve a source to Parquet objects, plan, read.

Planning lists the source (one listing for a directory, none for an object)
and asks the lakehouse cache for one :class:`~nexus_cache.lakehouse.ReadPlan`
per object: its identity and the hit / miss / bypass decision. Execution
carries the plans out; a plan that no longer holds raises
:class:`~nexus_cache.errors.StalePlanError`, which the service treats as a
transient failure (a new attempt plans afresh).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache._roots import check_listed
from nexus_cache.backends import AllocationDomain
from nexus_cache.errors import (
    BackendUnavailableError,
    ConfigError,
    SourceFormatError,
    StalePlanError,
)
from nexus_cache.frames import DeviceFrame, decode_parquet
from nexus_cache.lakehouse import (
    CacheStatus,
    LakehouseCache,
    LakehouseFile,
    ReadDiagnostics,
    ReadPlan,
    resolve_source,
)
from nexus_cache.tables import hidden_path

if TYPE_CHECKING:
    from nexus_cache.service._table_scan import TableRead

__all__ = [
    "OpenedObject",
    "SourcePlan",
    "check_regular",
    "count_rows",
    "decode_object",
    "identity_problem",
    "lakehouse_summary",
    "one_word",
    "open_object",
    "plan_source",
]

#: what a user can do when an object's identity cannot be proven, per reason
_IDENTITY_HINTS = {
    "local_file_too_new": (
        "the file was modified less than local_min_age_s ago (3 s by default) and may "
        "still be written; query it again in a few seconds, or lower [lakehouse] "
        "local_min_age_s"
    ),
    "no_content_identity": (
        "the store reports no ETag or version id for it; serve the data from a store "
        "that does (S3, GCS, Azure) or from a local path"
    ),
    "no_size": "the store reports no size for it; serve the data from a store that does",
}


def identity_problem(read_plan: ReadPlan) -> str:
    """Why the device caches cannot key ``read_plan``'s object, and what to change."""
    reason = read_plan.identity_reason or "unknown"
    hint = _IDENTITY_HINTS.get(reason)
    return f"no proven identity ({reason}: {hint})" if hint else f"no proven identity ({reason})"


@dataclasses.dataclass(frozen=True)
class SourcePlan:
    """The lakehouse plans of every Parquet object of one source, in name order."""

    source: str
    plans: tuple[ReadPlan, ...]
    #: sizes found by listing, for plans that carry none (a bypass without identity)
    listed_sizes: tuple[int | None, ...] = ()
    #: the table snapshot, filter and pruning the plans come from (None: a plain listing)
    table: TableRead | None = None

    @property
    def total_bytes(self) -> int:
        listed = self.listed_sizes or (None,) * len(self.plans)
        return sum(p.size or s or 0 for p, s in zip(self.plans, listed, strict=True))

    @functools.cached_property
    def identity_keys(self) -> tuple[str, ...] | None:
        """The entry keys of every object, or None when one has no proven identity
        (found once: the plan never changes)."""
        keys = tuple(p.key for p in self.plans if p.key is not None)
        return keys if len(keys) == len(self.plans) else None

    @property
    def identity_problems(self) -> str | None:
        """Why :attr:`identity_keys` is None (each distinct problem once), else None."""
        problems = sorted({identity_problem(p) for p in self.plans if p.key is None})
        return "; ".join(problems) or None

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "objects": [
                {
                    "location": p.identity.location if p.identity else p.source,
                    "key": p.key,
                    "size": p.size,
                    "status": p.status.value,
                    "read_mode": p.read_mode.value,
                    "fill_mode": p.fill_mode.value,
                    "reason": p.reason,
                }
                for p in self.plans
            ],
            "table": None if self.table is None else self.table.to_dict(),
        }


def _list_objects(source: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, list[str]]:
    options = None if storage_options is None else dict(storage_options)
    try:
        fs, path = resolve_source(source, None, options)
    except ImportError as exc:  # fsspec knows the protocol; its package is not installed
        raise BackendUnavailableError(
            f"source {source!r} needs a package that is not installed ({exc}); install it"
        ) from exc
    except ValueError as exc:
        if "protocol" not in str(exc).lower():
            raise
        raise ConfigError(
            f"source {source!r}: {exc}; use a local path, file://, s3:// or another fsspec URL"
        ) from exc
    if fs is None:
        if os.path.isdir(path):
            names = sorted(
                p
                for root, _dirs, files in os.walk(path)
                for p in (os.path.join(root, name) for name in files)
                if p.endswith(".parquet") and not hidden_path(os.path.relpath(p, path))
            )
        elif os.path.exists(path):
            names = [path]
        else:
            raise FileNotFoundError(f"source {source!r} does not exist; check the path")
        for name in names:
            check_regular(source, name)
    else:
        try:
            names = _list_remote(fs, path)
        except ValueError as exc:
            # fsspec's answer to a URL that names no object or bucket
            # ("s3://": "Cannot traverse all of S3"): bad input, not a failure
            raise ConfigError(
                f"source {source!r} cannot be listed ({exc}); name a bucket and a path, "
                "e.g. s3://bucket/table/"
            ) from exc
    if not names:
        raise ConfigError(f"source {source!r} holds no .parquet object; point it at Parquet data")
    return fs, names


def check_regular(source: str, name: str) -> None:
    """Refuse a local object that is not a regular file.

    Opening a FIFO waits for a writer forever, and a device or socket holds
    no Parquet: a query (or a directory listing) that names one is refused,
    naming it, before anything is opened. A listing is refused whole rather
    than skipping the object, so that no query silently answers over part
    of its data.
    """
    try:
        mode = os.stat(name).st_mode
    except FileNotFoundError:
        return  # gone meanwhile (or a dangling link): planning says so
    if stat.S_ISREG(mode):
        return
    kind = (
        "a FIFO (named pipe)"
        if stat.S_ISFIFO(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "not a regular file"
    )
    where = "" if name == source else f" (listed in source {source!r})"
    raise SourceFormatError(
        f"{name!r}{where} is {kind}, not a Parquet file; remove it or point the query "
        "at regular files"
    )


def _list_remote(fs: Any, path: str) -> list[str]:
    if not fs.isdir(path):
        return [path]
    base = path.rstrip("/")
    return sorted(
        p
        for p in fs.find(path)
        if p.endswith(".parquet") and not hidden_path(p[len(base) :].lstrip("/"))
    )


def plan_source(
    cache: LakehouseCache,
    source: str,
    storage_options: Mapping[str, Any] | None = None,
    allowed_roots: Sequence[str] | None = None,
) -> SourcePlan:
    """One lakehouse plan per Parquet object of ``source`` (a file or a directory);
    ``storage_options`` go to fsspec for a remote URL.

    With ``allowed_roots``, the source and every object its listing found must
    lie under one of them (local objects after resolving symlinks and ``..``):
    :class:`ConfigError` naming the first one outside, before anything is read.
    """
    if allowed_roots is not None:
        check_listed(source, (), allowed_roots)  # the source itself, before it is listed
    fs, names = _list_objects(source, storage_options)
    if allowed_roots is not None:
        listed = names if fs is None else [fs.unstrip_protocol(name) for name in names]
        check_listed(source, listed, allowed_roots)
    plans = tuple(
        cache.plan(name, fs=fs) if fs is not None else cache.plan(name) for name in names
    )
    # A plan without identity (no cache root, a file too new) carries no size;
    # the grant still has to be sized from the data, or the first attempt of
    # any query over min_grant_bytes does its whole work and is retried.
    sizes = tuple(
        p.size if p.size is not None else _object_size(fs, name)
        for p, name in zip(plans, names, strict=True)
    )
    return SourcePlan(source, plans, sizes)


def _object_size(fs: Any, name: str) -> int | None:
    try:
        return os.path.getsize(name) if fs is None else int(fs.size(name))
    except (OSError, TypeError, ValueError):  # gone, or a store that reports no size
        return None


def decode_object(
    cache: LakehouseCache,
    read_plan: ReadPlan,
    columns: Sequence[str] | None,
    domain: AllocationDomain,
    diagnostics: list[ReadDiagnostics],
    file_columns: Callable[[pa.Schema], Sequence[str]] | None = None,
    *,
    row_groups: Sequence[int] | None = None,
    opened: OpenedObject | None = None,
    footer: pq.FileMetaData | None = None,
) -> DeviceFrame:
    """Read one planned object through the cache and decode it into ``domain``.

    ``file_columns``, when given, picks the columns to decode from the object's
    own Arrow schema (read from its footer) instead of ``columns``.
    ``row_groups``: decode only these (default: all). ``opened``: the object
    already opened by :func:`open_object` (its footer read); it is closed here.
    ``footer``: the object's footer, parsed before (for the same proven identity),
    used when no ``opened`` is given. The footer is read and parsed once: the decode
    reuses the parsed one.
    Appends the read's diagnostics to ``diagnostics`` (an ``opened`` object's
    were appended when it was opened). Raises :class:`StalePlanError` when the
    plan no longer holds.
    """
    handle = _execute(cache, read_plan, diagnostics) if opened is None else opened.handle
    with handle, _parquet_errors(read_plan):
        metadata = footer if opened is None else opened.metadata
        if file_columns is not None:
            if opened is not None:
                schema = opened.schema
            elif metadata is not None:  # the schema a reader of this footer gives, no reader
                schema = metadata.schema.to_arrow_schema()
            else:
                parquet = pq.ParquetFile(handle)  # the footer, read and parsed here
                metadata, schema = parquet.metadata, parquet.schema_arrow
            columns = list(file_columns(schema))
        if metadata is not None:
            handle.seek(0)
        # the footer parsed above (or to prune row groups) is not read again
        return decode_parquet(
            handle, domain=domain, columns=columns, row_groups=row_groups, metadata=metadata
        )


@dataclasses.dataclass(frozen=True)
class OpenedObject:
    """One planned object opened through the lakehouse cache, and its Parquet footer."""

    handle: LakehouseFile
    metadata: pq.FileMetaData
    schema: pa.Schema  # the object's Arrow schema (as its writer stored it)

    def close(self) -> None:
        self.handle.close()


def open_object(
    cache: LakehouseCache, read_plan: ReadPlan, diagnostics: list[ReadDiagnostics]
) -> OpenedObject:
    """Open one planned object and read its footer (the last bytes of the object);
    close it with :meth:`OpenedObject.close` or by passing it to
    :func:`decode_object`. Appends the read's diagnostics to ``diagnostics``."""
    handle = _execute(cache, read_plan, diagnostics)
    try:
        with _parquet_errors(read_plan):
            parquet = pq.ParquetFile(handle)
            metadata, schema = parquet.metadata, parquet.schema_arrow
    except BaseException:
        handle.close()
        raise
    return OpenedObject(handle, metadata, schema)


def count_rows(cache: LakehouseCache, plan: SourcePlan, diagnostics: list[ReadDiagnostics]) -> int:
    """Rows of every object, from the Parquet footers (read through the cache)."""
    total = 0
    for read_plan in plan.plans:
        with _execute(cache, read_plan, diagnostics) as handle, _parquet_errors(read_plan):
            total += pq.ParquetFile(handle).metadata.num_rows
    return total


@contextlib.contextmanager
def _parquet_errors(read_plan: ReadPlan) -> Iterator[None]:
    """Name the object when Arrow cannot read it as Parquet (not a transient failure)."""
    try:
        yield
    except pa.ArrowInvalid as exc:
        raise SourceFormatError(
            f"{read_plan.source!r} is not readable Parquet ({' '.join(str(exc).split())}); "
            "point the query at Parquet data"
        ) from exc


def _execute(
    cache: LakehouseCache, read_plan: ReadPlan, diagnostics: list[ReadDiagnostics]
) -> LakehouseFile:
    """Execute one plan, recording its diagnostics; a stale plan is recorded as ``stale``."""
    try:
        handle = cache.execute(read_plan)
    except StalePlanError as exc:
        diagnostics.append(read_plan.diagnostics(cache_status=CacheStatus.STALE, reason=str(exc)))
        raise
    diagnostics.append(handle.diagnostics)
    return handle


def lakehouse_summary(diagnostics: Sequence[ReadDiagnostics] | None, plan: SourcePlan) -> dict:
    """One status for a source: the reads' statuses when it was read, else the plans'.

    A query that read nothing (the decoded-source cache served it) made no
    copy: a planned miss is reported as ``miss-followed`` (another query's
    read, which it waited for or came after, made the copy), so that the
    ``miss`` count is the copies made.
    """
    if diagnostics:
        reasons = sorted({d.reason for d in diagnostics if d.reason})
        statuses = [d.cache_status.value for d in diagnostics]
        modes = [d.read_mode.value for d in diagnostics]
        fills = [d.fill_mode.value for d in diagnostics]
        read = True
    else:
        reasons = sorted({p.reason for p in plan.plans if p.reason})
        statuses = [_not_read(p.status).value for p in plan.plans]
        modes = ["not_read"] * len(plan.plans)
        fills = ["none"] * len(plan.plans)
        read = False
    return {
        "status": one_word(statuses),
        "read_mode": one_word(modes),
        "fill_mode": one_word(fills),
        "reason": "; ".join(reasons) or None,
        "objects": len(plan.plans),
        "read": read,
    }


def _not_read(planned: CacheStatus) -> CacheStatus:
    return CacheStatus.MISS_FOLLOWED if planned is CacheStatus.MISS else planned


def one_word(values: Sequence[str]) -> str:
    """``hit`` when all agree, else ``mixed(a,b)``: one word for a table cell;
    ``none`` for no value (a table read whose filter pruned every object)."""
    distinct = sorted(set(values))
    if not distinct:
        return "none"
    if len(distinct) == 1:
        return distinct[0]
    return "mixed(" + ",".join(distinct) + ")"
