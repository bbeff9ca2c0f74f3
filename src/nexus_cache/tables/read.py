"""The host reference reader: a snapshot, a projection and a filter as an Arrow table.

:func:`read_table` plans the scan (:func:`~nexus_cache.tables.pruning.plan_scan`:
partitions, file bounds, then row groups by footer statistics), reads the
kept row groups with pyarrow, fills each file's columns into the table's
schema (partition columns from the file's partition values, a column the
file lacks as nulls, Iceberg columns by field id), applies the filter as a
mask (:func:`~nexus_cache.tables.mask.filter_mask` on NumPy, the code path a
GPU runs on CuPy) and returns the projected columns. It is the correctness
reference for reading tables. Thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache.errors import ConfigError, SourceFormatError
from nexus_cache.tables.filters import canonical_filter
from nexus_cache.tables.mask import filter_mask, host_columns
from nexus_cache.tables.pruning import ScanPlan, file_column_names, plan_scan
from nexus_cache.tables.snapshot import DataFile, TableSnapshot

__all__ = ["read_table", "read_table_with_plan"]


def read_table(
    snapshot: TableSnapshot, columns: Sequence[str] | None = None, filter: Any = None
) -> pa.Table:
    """The rows of ``snapshot`` that satisfy ``filter`` (pyarrow's ``filters``
    convention), with ``columns`` (all when None) in the table's schema."""
    return read_table_with_plan(snapshot, columns, filter)[0]


def read_table_with_plan(
    snapshot: TableSnapshot, columns: Sequence[str] | None = None, filter: Any = None
) -> tuple[pa.Table, ScanPlan]:
    """:func:`read_table`, and the :class:`ScanPlan` it read by."""
    schema = snapshot.schema
    flt = canonical_filter(filter, schema)
    output = list(schema.names) if columns is None else list(columns)
    unknown = [c for c in output if schema.get_field_index(c) < 0]
    if unknown or isinstance(columns, str):
        raise ConfigError(
            f"columns={columns!r}: the table has no column {unknown[0] if unknown else columns!r}"
            f" (its columns: {', '.join(schema.names[:20])}); name columns of the table"
        )
    needed = [n for n in schema.names if n in set(output) | set(flt.columns if flt else ())]
    read_schema = pa.schema([schema.field(n) for n in needed])
    plan = plan_scan(snapshot, flt, lambda f: _open(snapshot, f).metadata)
    parts = [
        _read_file(snapshot, planned.file, planned.row_groups, read_schema)
        for planned in plan.files
    ]
    table = pa.concat_tables(parts) if parts else read_schema.empty_table()
    if flt is not None and table.num_rows:
        mask = filter_mask(flt, host_columns(table, flt.columns), table.num_rows, np)
        table = table.filter(pa.array(mask))
    return _without_field_ids(table.select(output)), plan


def _open(snapshot: TableSnapshot, file: DataFile) -> pq.ParquetFile:
    try:
        if snapshot.filesystem is None:
            return pq.ParquetFile(file.path)
        return pq.ParquetFile(snapshot.filesystem.open(file.path, "rb"))
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise snapshot.missing_file(file.path) from exc
        raise SourceFormatError(
            f"{file.path!r} (in table {snapshot.location!r}) is not readable Parquet "
            f"({exc}); check the file"
        ) from exc


def _read_file(
    snapshot: TableSnapshot,
    file: DataFile,
    row_groups: Sequence[int] | None,
    read_schema: pa.Schema,
) -> pa.Table:
    handle = _open(snapshot, file)
    file_schema = handle.schema_arrow
    names = file_column_names(read_schema, file_schema)
    wanted = sorted(set(names.values()), key=file_schema.get_field_index)
    if row_groups is None:
        data = handle.read(columns=wanted)
    else:
        data = handle.read_row_groups(list(row_groups), columns=wanted)
    rows = data.num_rows
    partition = dict(file.partition)
    arrays = []
    for f in read_schema:
        if f.name in names:
            column = data.column(names[f.name])
            arrays.append(column.cast(f.type) if column.type != f.type else column)
        elif f.name in partition:
            arrays.append(pa.array([partition[f.name]] * rows, type=f.type))
        else:
            arrays.append(pa.nulls(rows, type=f.type))
    return pa.Table.from_arrays(arrays, schema=read_schema)


def _without_field_ids(table: pa.Table) -> pa.Table:
    fields = [pa.field(f.name, f.type, f.nullable) for f in table.schema]
    return table.cast(pa.schema(fields)) if fields != list(table.schema) else table
