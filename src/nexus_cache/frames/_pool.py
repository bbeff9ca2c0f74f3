"""Parallel host decode of Parquet row groups, handed out in row-group order.

A cold read is bound by the host decode (decompression and page decoding),
not by the host-to-device copy: one decoder thread reaches about a tenth of
what the copy engine moves. So the column chunks of the row groups are
decoded by a pool of threads, each with its own ``ParquetFile`` over one
shared, thread-safe view of the file's bytes (PyArrow decodes without
holding the GIL), while the calling thread copies finished row groups to the
device in order.

Memory stays bounded: column chunks are submitted only while the decoded
bytes in flight (the footer's uncompressed sizes) stay under
``window_bytes``; at least one is always in flight, so a chunk larger than
the window still decodes.

Settings (arguments of :func:`~nexus_cache.frames.decode_parquet`, else the
variables below, else the defaults):

* ``NEXUS_DECODE_THREADS``: decoder threads (default: the CPUs this process
  may run on, at most 16);
* ``NEXUS_DECODE_WINDOW_BYTES``: decoded bytes in flight (default 64 MiB a
  thread, at most 1 GiB).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache._env import parse_whole, read, refusal
from nexus_cache._sizes import parse_size
from nexus_cache.frames._host import HostPiece, host_piece
from nexus_cache.frames._variables import DECODE_THREADS, DECODE_WINDOW_BYTES, MAX_DECODE_THREADS

__all__ = [
    "ENV_DECODE_THREADS",
    "ENV_DECODE_WINDOW_BYTES",
    "INLINE_BYTES",
    "MAX_DECODE_THREADS",
    "RowGroupPool",
    "buffer_opener",
    "decode_settings",
]

ENV_DECODE_THREADS = DECODE_THREADS.name
ENV_DECODE_WINDOW_BYTES = DECODE_WINDOW_BYTES.name
#: A read of at most this many column-chunk bytes is decoded in the calling
#: thread (no pool), by Arrow's own threads.
INLINE_BYTES = 16 << 20
_DEFAULT_MAX_THREADS = 16  # past this, one file's row groups rarely keep more busy
_WINDOW_PER_THREAD = 64 << 20
_MAX_DEFAULT_WINDOW = 1 << 30

Decoded = tuple[int, list[HostPiece]]


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not every platform has affinity
        return os.cpu_count() or 1


def _threads_setting(threads: int | None) -> int:
    if threads is None:
        count = read(DECODE_THREADS)
        return count if count is not None else max(1, min(_cpus(), _DEFAULT_MAX_THREADS))
    if isinstance(threads, str):  # an argument is an int; text is for the variable
        raise refusal("threads", threads, f"a whole number from 1 to {MAX_DECODE_THREADS}")
    return parse_whole(threads, "threads", minimum=1, maximum=MAX_DECODE_THREADS)


def decode_settings(
    threads: int | None = None, window_bytes: int | str | None = None
) -> tuple[int, int]:
    """Validated ``(threads, window_bytes)``: the arguments where given, else
    ``NEXUS_DECODE_THREADS`` / ``NEXUS_DECODE_WINDOW_BYTES``, else the defaults.
    Raises ConfigError naming the argument or variable."""
    count = _threads_setting(threads)
    if window_bytes is None:
        window = read(DECODE_WINDOW_BYTES)
        if window is None:
            return count, min(count * _WINDOW_PER_THREAD, _MAX_DEFAULT_WINDOW)
        return count, int(window)
    return count, parse_size(window_bytes, name="window_bytes")


def _chunk_sizes(pf: pq.ParquetFile, group: int) -> dict[str, int]:
    """Decoded bytes of each top-level column of ``group``, as the footer states them."""
    meta = pf.metadata.row_group(group)
    sizes: dict[str, int] = {}
    for i in range(meta.num_columns):
        chunk = meta.column(i)
        name = chunk.path_in_schema.split(".")[0]
        sizes[name] = sizes.get(name, 0) + int(chunk.total_uncompressed_size)
    return sizes


class RowGroupPool:
    """Decodes ``columns`` of ``groups`` of a Parquet file on ``threads`` threads;
    iterate it for ``(rows, pieces)`` per row group, in the order of ``groups``
    (pieces in the order of ``columns``; a read decoded inline, below, gives one
    ``(rows, pieces)`` for all its row groups where Arrow gave each column in one
    piece). Every piece is a buffer decoded for this pool's caller alone.

    The unit of work is one column of one row group, handed out in row-group
    order: the threads finish row group *i* first, so the caller copies it
    while they decode the next ones, and a file with few row groups still
    keeps every thread busy. ``opener`` returns a new ``ParquetFile`` over the
    same bytes; it is called once per worker thread, so every thread reads
    through its own reader. Iterate from one thread. :meth:`close` (also on
    any exception, interrupts included, in the iterating thread) cancels what
    has not started and waits for what has, so no worker touches the file
    after it returns. ``on_decoded(seconds)`` is called from worker threads
    with each unit's decode time. A read of at most ``inline_bytes`` of column
    chunks is decoded in the iterating thread instead, with no pool.
    """

    def __init__(
        self,
        opener: Callable[[], pq.ParquetFile],
        footer: pq.ParquetFile,
        groups: Sequence[int],
        columns: Sequence[str],
        *,
        threads: int,
        window_bytes: int,
        on_decoded: Callable[[float], None],
        inline_bytes: int = 0,
    ) -> None:
        self._opener = opener
        self._columns = list(columns)
        self._rows = {g: footer.metadata.row_group(g).num_rows for g in groups}
        self._units: list[tuple[int, str, int]] = []
        for g in groups:
            sizes = _chunk_sizes(footer, g)
            self._units.extend((g, c, sizes.get(c, 0)) for c in self._columns)
        self._groups = list(groups)
        self._threads = max(1, min(threads, len(self._units) or 1))
        self._window = window_bytes
        self._on_decoded = on_decoded
        self._local = threading.local()
        self._stop = threading.Event()
        # A small read (a filtered scan's few row groups) costs more in starting
        # threads and parsing a footer per thread than in decoding: it is read
        # here, from the footer's reader, by Arrow's own threads.
        self._footer = footer
        small = sum(unit[2] for unit in self._units) <= inline_bytes
        self._executor = (
            None if small else ThreadPoolExecutor(self._threads, thread_name_prefix="nexus-decode")
        )
        if self._executor is None:
            self._threads = 1

    @property
    def threads(self) -> int:
        """Decoder threads this pool runs (never more than its units of work)."""
        return self._threads

    def _decode(self, group: int, column: str) -> HostPiece:
        if self._stop.is_set():
            raise _Stopped
        pf = getattr(self._local, "pf", None)
        if pf is None:
            pf = self._local.pf = self._opener()
        started = time.perf_counter()
        table = pf.read_row_group(group, columns=[column], use_threads=False)
        piece = host_piece(table.column(0), column)
        self._on_decoded(time.perf_counter() - started)
        return piece

    def _submit(self) -> Iterator[tuple[int, Future[HostPiece], int]]:
        """Every unit, submitted as the window allows; yields them in order."""
        executor = self._executor
        assert executor is not None  # only the pooled path submits
        pending: deque[tuple[int, Future[HostPiece], int]] = deque()
        in_flight = 0
        for group, column, size in self._units:
            # Keep every thread busy and the window full, one unit at least.
            while pending and (
                in_flight + size > self._window or len(pending) >= 4 * self._threads
            ):
                unit = pending.popleft()
                in_flight -= unit[2]
                yield unit
            pending.append((group, executor.submit(self._decode, group, column), size))
            in_flight += size
        yield from pending

    def _inline(self) -> Iterator[Decoded]:
        """The row groups read in the iterating thread (see ``INLINE_BYTES``): one
        Arrow call for them all (its threads take row groups and columns alike),
        then every row as one item where each column came in one piece (a host
        domain takes such a piece as the column's buffer, with no copy), else each
        row group's rows as zero-copy slices (a dictionary column keeps its row
        groups' dictionaries apart)."""
        if self._stop.is_set() or not self._groups:
            return
        started = time.perf_counter()
        table = self._footer.read_row_groups(self._groups, columns=self._columns, use_threads=True)
        self._on_decoded(time.perf_counter() - started)
        if all(column.num_chunks == 1 for column in table.columns):
            yield (
                table.num_rows,
                [host_piece(table.column(i), c) for i, c in enumerate(self._columns)],
            )
            return
        at = 0
        for group in self._groups:
            if self._stop.is_set():
                return
            rows = self._rows[group]
            part = table.slice(at, rows)
            at += rows
            yield rows, [host_piece(part.column(i), c) for i, c in enumerate(self._columns)]

    def __iter__(self) -> Iterator[Decoded]:
        if self._executor is None:
            try:
                yield from self._inline()
            finally:
                self.close()
            return
        try:
            units = self._submit()
            for group in self._groups:
                pieces = []
                for _ in self._columns:
                    _, future, _ = next(units)
                    pieces.append(future.result())
                yield self._rows[group], pieces
        finally:
            self.close()

    def close(self) -> None:
        """Cancel work not yet started and wait for the running work (idempotent)."""
        self._stop.set()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)


class _Stopped(Exception):
    """A row group that was not decoded because the pool was closed."""


def buffer_opener(
    buffer: Any, read_dictionary: Sequence[str] | None, metadata: Any
) -> Callable[[], pq.ParquetFile]:
    """An opener of readers over one in-memory (or memory-mapped) ``buffer``:
    each reader is independent, so threads never share a file position."""

    def opener() -> pq.ParquetFile:
        return pq.ParquetFile(
            pa.BufferReader(buffer), metadata=metadata, read_dictionary=read_dictionary
        )

    return opener
