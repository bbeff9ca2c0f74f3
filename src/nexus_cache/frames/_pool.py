"""Parallel host decode of Parquet row groups, handed out in row-group order.

A cold read is bound by the host decode (decompression and page decoding),
not by the host-to-device copy: one decoder thread reaches about a tenth of
what the copy engine moves. So row groups are decoded by a pool of threads,
each with its own ``ParquetFile`` over one shared, thread-safe view of the
file's bytes (PyArrow decodes without holding the GIL), while the calling
thread copies finished row groups to the device in order.

Memory stays bounded: row groups are submitted only while the decoded bytes
in flight (estimated from the footer's uncompressed sizes) stay under
``window_bytes``; at least one row group is always in flight, so a row group
larger than the window still decodes.

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

import pyarrow.parquet as pq

from nexus_cache._numbers import parse_int_text
from nexus_cache._sizes import parse_size
from nexus_cache.errors import ConfigError
from nexus_cache.frames._host import HostPiece, host_piece

__all__ = [
    "ENV_DECODE_THREADS",
    "ENV_DECODE_WINDOW_BYTES",
    "MAX_DECODE_THREADS",
    "RowGroupPool",
    "buffer_opener",
    "decode_settings",
]

ENV_DECODE_THREADS = "NEXUS_DECODE_THREADS"
ENV_DECODE_WINDOW_BYTES = "NEXUS_DECODE_WINDOW_BYTES"
MAX_DECODE_THREADS = 256
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
        raw = os.environ.get(ENV_DECODE_THREADS, "")
        if raw.strip() == "":
            return max(1, min(_cpus(), _DEFAULT_MAX_THREADS))
        shown = f"{ENV_DECODE_THREADS}={raw!r}"
        try:
            count = parse_int_text(raw)
        except ValueError:
            count = 0
    else:
        shown = f"threads={threads!r}"
        count = threads if isinstance(threads, int) and not isinstance(threads, bool) else 0
    if not 1 <= count <= MAX_DECODE_THREADS:
        raise ConfigError(
            f"{shown} is not accepted; use a whole number of decoder threads "
            f"from 1 to {MAX_DECODE_THREADS}"
        )
    return count


def decode_settings(
    threads: int | None = None, window_bytes: int | str | None = None
) -> tuple[int, int]:
    """Validated ``(threads, window_bytes)``: the arguments where given, else
    ``NEXUS_DECODE_THREADS`` / ``NEXUS_DECODE_WINDOW_BYTES``, else the defaults.
    Raises ConfigError naming the argument or variable."""
    count = _threads_setting(threads)
    if window_bytes is None:
        raw = os.environ.get(ENV_DECODE_WINDOW_BYTES, "")
        if raw.strip() == "":
            return count, min(count * _WINDOW_PER_THREAD, _MAX_DEFAULT_WINDOW)
        return count, parse_size(raw, name=ENV_DECODE_WINDOW_BYTES)
    return count, parse_size(window_bytes, name="window_bytes")


def _estimate(pf: pq.ParquetFile, group: int, columns: Sequence[str] | None) -> int:
    """Decoded bytes of ``group`` as the footer states them (uncompressed sizes)."""
    meta = pf.metadata.row_group(group)
    wanted = None if columns is None else set(columns)
    total = 0
    for i in range(meta.num_columns):
        chunk = meta.column(i)
        if wanted is None or chunk.path_in_schema.split(".")[0] in wanted:
            total += int(chunk.total_uncompressed_size)
    return total


class RowGroupPool:
    """Decodes ``groups`` of a Parquet file on ``threads`` threads; iterate it for
    ``(rows, pieces)`` in the order of ``groups``.

    ``opener`` returns a new ``ParquetFile`` over the same bytes; it is called
    once per worker thread, so every thread reads through its own reader.
    Iterate from one thread. :meth:`close` (also on any exception, interrupts
    included, in the iterating thread) cancels what has not started and waits
    for what has, so no worker touches the file after it returns.
    ``on_decoded(seconds)`` is called from worker threads with each row group's
    decode time.
    """

    def __init__(
        self,
        opener: Callable[[], pq.ParquetFile],
        estimate_from: pq.ParquetFile,
        groups: Sequence[int],
        columns: Sequence[str] | None,
        *,
        threads: int,
        window_bytes: int,
        on_decoded: Callable[[float], None],
    ) -> None:
        self._opener = opener
        self._columns = None if columns is None else list(columns)
        self._groups = [(g, _estimate(estimate_from, g, columns)) for g in groups]
        self._threads = max(1, min(threads, len(self._groups) or 1))
        # Fewer row groups than threads: let PyArrow spread each one's columns.
        self._inner_threads = len(self._groups) < threads
        self._window = window_bytes
        self._on_decoded = on_decoded
        self._local = threading.local()
        self._stop = threading.Event()
        self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="nexus-decode")

    @property
    def threads(self) -> int:
        """Decoder threads this pool runs (never more than its row groups)."""
        return self._threads

    def _decode(self, group: int) -> Decoded:
        if self._stop.is_set():
            raise _Stopped
        pf = getattr(self._local, "pf", None)
        if pf is None:
            pf = self._local.pf = self._opener()
        started = time.perf_counter()
        table = pf.read_row_group(group, columns=self._columns, use_threads=self._inner_threads)
        pieces = [host_piece(table.column(i), f.name) for i, f in enumerate(table.schema)]
        self._on_decoded(time.perf_counter() - started)
        return table.num_rows, pieces

    def __iter__(self) -> Iterator[Decoded]:
        pending: deque[tuple[Future[Decoded], int]] = deque()
        queued = iter(self._groups)
        in_flight = 0
        try:
            for group, size in queued:
                # Keep every thread busy and the window full, one group at least.
                while pending and (
                    in_flight + size > self._window or len(pending) >= 2 * self._threads
                ):
                    future, done_size = pending.popleft()
                    in_flight -= done_size
                    yield future.result()
                pending.append((self._executor.submit(self._decode, group), size))
                in_flight += size
            while pending:
                future, _ = pending.popleft()
                yield future.result()
        finally:
            self.close()

    def close(self) -> None:
        """Cancel row groups not yet started and wait for the running ones (idempotent)."""
        self._stop.set()
        self._executor.shutdown(wait=True, cancel_futures=True)


class _Stopped(Exception):
    """A row group that was not decoded because the pool was closed."""


def buffer_opener(
    buffer: Any, read_dictionary: Sequence[str] | None, metadata: Any
) -> Callable[[], pq.ParquetFile]:
    """An opener of readers over one in-memory (or memory-mapped) ``buffer``:
    each reader is independent, so threads never share a file position."""
    import pyarrow as pa

    def opener() -> pq.ParquetFile:
        return pq.ParquetFile(
            pa.BufferReader(buffer), metadata=metadata, read_dictionary=read_dictionary
        )

    return opener
