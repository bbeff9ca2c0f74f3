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
from nexus_cache.service.queries import Count, GraphQuery, Query

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
    first = plan["source"]["objects"][0]["location"]
    options = None if storage_options is None else dict(storage_options)
    fs, path = resolve_source(first, None, options)
    if fs is None:
        schema = decoded_schema(pq.ParquetFile(path), query.columns)
    else:
        with fs.open(path, "rb") as handle:
            schema = decoded_schema(pq.ParquetFile(handle), query.columns)
    return schema.remove_metadata()
