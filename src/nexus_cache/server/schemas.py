"""The schema a query's result will have, without running it (``get_schema``,
``FlightInfo.schema``).

* a count: one int64 column ``rows``;
* a graph query: its algorithm's result columns, from the one registry
  (:data:`nexus_cache.graph.registry.ALGORITHMS`);
* a scan: the projected columns as the decoder gives them, read from the
  footer of the source's first planned object (no data page is read).

Schema metadata is left out (the result's carries the diagnostics). Pure
functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache.frames.decode import decoded_schema
from nexus_cache.graph.registry import get_spec
from nexus_cache.lakehouse import resolve_source
from nexus_cache.service.queries import Count, GraphQuery, Query, Scan

__all__ = ["result_schema"]


def result_schema(
    query: Query, plan: Mapping[str, Any], storage_options: Mapping[str, Any] | None
) -> pa.Schema:
    """The schema of ``query``'s result; ``plan`` is ``QueryService.plan(query)``."""
    if isinstance(query, Count):
        return pa.schema([pa.field("rows", pa.int64())])
    if isinstance(query, GraphQuery):
        # nullable as the result table's fields are (GraphResult.to_arrow)
        return pa.schema(
            [pa.field(c.name, c.arrow_type()) for c in get_spec(query.algorithm).columns]
        )
    options = None if storage_options is None else dict(storage_options)
    if isinstance(query, Scan) and plan["source"].get("table") is not None:
        return _table_schema(query, options)
    first = plan["source"]["objects"][0]["location"]
    fs, path = resolve_source(first, None, options)
    if fs is None:
        schema = decoded_schema(pq.ParquetFile(path), query.columns)
    else:
        with fs.open(path, "rb") as handle:
            schema = decoded_schema(pq.ParquetFile(handle), query.columns)
    return schema.remove_metadata()


def _table_schema(query: Scan, options: dict[str, Any] | None) -> pa.Schema:
    """A table read's result schema: the snapshot's columns the scan outputs (Hive
    partition columns included), as plain fields, whatever the filter prunes."""
    from nexus_cache.tables import resolve_table

    snapshot = resolve_table(query.source, query.as_of, storage_options=options)
    names = list(snapshot.schema.names) if query.columns is None else list(query.columns)
    return pa.schema([_plain(snapshot.schema.field(n)) for n in names])


def _plain(field: pa.Field) -> pa.Field:
    return pa.field(field.name, field.type, field.nullable)
