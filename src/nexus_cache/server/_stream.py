"""A query's result as the stream of record batches its client reads.

Batches of about :data:`BATCH_BYTES` (small chunks joined, large ones split);
the stream stops at the next batch when the client cancels or goes away or
the query is cancelled on the server, and says once how it ended.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from nexus_cache.errors import QueryCancelledError
from nexus_cache.server._answers import flight_error
from nexus_cache.server._running import RunningQuery

__all__ = ["BATCH_BYTES", "ResultStream", "coalesced"]

# Bytes per streamed batch: large enough that per-batch overhead vanishes,
# small enough that a cancelled client is noticed within a few milliseconds.
BATCH_BYTES = 8 << 20


class ResultStream:
    """Yields a result's batches, stopping when the client cancelled or went away
    or the query was cancelled (``running.cancel``: a server stopping, the
    ``cancel`` action, the status page); the latter ends the stream with a
    Flight error, so a client still reading never takes the batches sent so far
    for the whole result.

    ``done(outcome)`` runs exactly once: at the end of the stream, when it is
    stopped early, or when gRPC drops it unread (``__del__``).
    """

    def __init__(
        self,
        table: pa.Table,
        context: Any,
        running: RunningQuery,
        done: Callable[[str], None],
    ) -> None:
        per_row = max(1, table.nbytes // max(1, table.num_rows))
        self._batches = coalesced(table, max(1, BATCH_BYTES // per_row))
        self._rows = table.num_rows
        self._sent = 0
        self._context = context
        self._running = running
        self._done: Callable[[str], None] | None = done

    def __iter__(self) -> ResultStream:
        return self

    def __next__(self) -> pa.RecordBatch:
        if self._context.is_cancelled():  # nobody left to tell
            self._close("cancelled")
            raise StopIteration
        if self._running.cancel.is_set():
            self._close("cancelled")
            # The client is still reading: a plain end of stream would hand it
            # the batches sent so far as if they were the whole result.
            cut = f"the result was cut short after {self._sent} of {self._rows} rows"
            raise flight_error(
                QueryCancelledError(
                    f"the server is stopping: {cut} and is withdrawn; run the query again "
                    "against a running server"
                    if self._running.by_server
                    else f"query {self._running.query_id} was cancelled on the server (its "
                    f"cancel action or the status page): {cut} and is withdrawn"
                )
            )
        try:
            batch = next(self._batches)
        except StopIteration:
            self._close("ok")
            raise
        self._sent += batch.num_rows
        return batch

    def _close(self, outcome: str) -> None:
        done, self._done = getattr(self, "_done", None), None
        self._batches = iter(())  # the table's memory goes with the last reference
        if done is not None:
            done(outcome)

    def __del__(self) -> None:
        self._close("cancelled")


def coalesced(table: pa.Table, rows: int) -> Iterator[pa.RecordBatch]:
    """``table`` as batches of about ``rows`` rows: small chunks (a scan's
    ``batch_rows``) are joined, since each Flight message costs about as much as
    copying a few MiB, and large ones split."""
    group: list[pa.RecordBatch] = []
    count = 0
    for batch in table.to_batches(max_chunksize=rows):
        group.append(batch)
        count += batch.num_rows
        if count >= rows:
            yield _joined(group)
            group, count = [], 0
    if group:
        yield _joined(group)


def _joined(group: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(group) == 1:
        return group[0]
    batches = pa.Table.from_batches(group).combine_chunks().to_batches()
    return batches[0] if batches else group[0]  # none: the group had no row
