"""Decode Parquet into a :class:`DeviceFrame`, row group by row group.

Two stages run at once:

* a decoder thread reads the projected columns of one row group after the
  other with PyArrow on the host (PyArrow decodes without holding the GIL)
  and turns each into NumPy buffers; a queue of one bounds it, so host
  memory holds at most three row groups (one being copied, one waiting,
  one being decoded);
* the calling thread moves each decoded row group into the domain through a
  :class:`~nexus_cache.frames.staging.Transfer` (on CUDA: pinned staging
  slots and one stream, see :mod:`nexus_cache.frames.staging`).

So while row group *i* is copied to the device, row group *i + 1* is decoded.
:func:`read_parquet` opens the source through the lakehouse cache (a hit
reads the local entry; a miss follows the cache's policy) and decodes it.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache.backends import AllocationDomain
from nexus_cache.errors import ConfigError, SourceFormatError
from nexus_cache.frames._builder import ColumnBuilder
from nexus_cache.frames._host import HostPiece, host_piece
from nexus_cache.frames.column import column_kind
from nexus_cache.frames.frame import DeviceFrame
from nexus_cache.frames.staging import DEFAULT_SLOT_BYTES, TransferStats, open_transfer

__all__ = ["DecodeStats", "decode_parquet", "read_parquet"]

_DONE = object()


@dataclass
class DecodeStats:
    """Where one decode spent its time (filled in when passed as ``stats=``).

    ``decode_seconds``: the decoder thread's host decode; ``wait_seconds``:
    how long the copying thread waited for decoded row groups; ``transfer``:
    the host-to-device stage (on CUDA the copy engine's busy time, measured
    with CUDA events); ``wall_seconds``: the whole call; ``lakehouse``: the
    lakehouse read's ``ReadDiagnostics``; ``source``: the source cache's
    ``SourceDiagnostics`` (:func:`~nexus_cache.frames.read_cached_parquet`).
    """

    row_groups: int = 0
    rows: int = 0
    host_bytes: int = 0
    decode_seconds: float = 0.0
    wait_seconds: float = 0.0
    wall_seconds: float = 0.0
    transfer: TransferStats = field(default_factory=TransferStats)
    lakehouse: Any = None
    source: Any = None


def _check_request(
    pf: pq.ParquetFile, columns: Sequence[str] | None, row_groups: Sequence[int] | None
) -> tuple[list[str] | None, list[int]]:
    names = pf.schema_arrow.names
    if columns is not None:
        if isinstance(columns, str):  # a string is iterable: "id" would mean ['i', 'd']
            raise ConfigError(f"columns={columns!r} is not accepted; use a list of names")
        columns = list(columns)
        missing = [c for c in columns if c not in names]
        if missing:
            raise ConfigError(f"columns {missing} are not in the Parquet schema; columns: {names}")
    count = pf.metadata.num_row_groups
    if row_groups is None:
        return columns, list(range(count))
    groups = [int(g) for g in row_groups]
    bad = [g for g in groups if not 0 <= g < count]
    if bad:
        raise ConfigError(f"row_groups {bad} do not exist; the file has {count} (0..{count - 1})")
    return columns, groups


def _decoder(
    pf: pq.ParquetFile,
    groups: list[int],
    columns: list[str] | None,
    out: queue.Queue[Any],
    stop: threading.Event,
    stats: DecodeStats,
) -> None:
    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    try:
        for group in groups:
            started = time.perf_counter()
            table = pf.read_row_group(group, columns=columns, use_threads=True)
            pieces = [host_piece(table.column(i), f.name) for i, f in enumerate(table.schema)]
            stats.decode_seconds += time.perf_counter() - started
            if not put((table.num_rows, pieces)):
                return
        put(_DONE)
    except BaseException as exc:  # handed to the caller, which re-raises it
        put(exc)


def decode_parquet(
    source: Any,
    *,
    domain: AllocationDomain,
    columns: Sequence[str] | None = None,
    row_groups: Sequence[int] | None = None,
    read_dictionary: Sequence[str] | None = None,
    stats: DecodeStats | None = None,
    slot_bytes: int | str = DEFAULT_SLOT_BYTES,
) -> DeviceFrame:
    """Decode ``columns`` (default all, in the order given) of ``row_groups``
    (default all) of the Parquet ``source`` into a frame allocated in ``domain``.

    ``source``: a path or a readable binary file object (e.g. a
    :class:`~nexus_cache.lakehouse.LakehouseFile`). ``read_dictionary``:
    columns to read as dictionary-encoded. ``slot_bytes``: size of each
    pinned staging slot on CUDA. The result equals
    ``pyarrow.parquet.read_table`` of the same projection (dictionary columns
    read from several row groups carry their row groups' dictionaries one
    after another). Raises ConfigError for unknown columns or row groups,
    SourceFormatError when ``source`` is not Parquet, and
    FrameTypeError for types a frame cannot hold; on any error every device
    allocation made so far is dropped. Thread-safe: concurrent decodes (into
    one domain or several) each use their own staging and decoder thread.
    """
    timing = stats is not None
    stats = stats if stats is not None else DecodeStats()
    started = time.perf_counter()
    try:
        pf = pq.ParquetFile(source, read_dictionary=read_dictionary)
    except pa.ArrowInvalid as exc:
        name = getattr(source, "path", None) or getattr(source, "name", None) or source
        raise SourceFormatError(
            f"{str(name)!r} is not readable Parquet ({' '.join(str(exc).split())}); "
            "point the read at Parquet data"
        ) from exc
    wanted, groups = _check_request(pf, columns, row_groups)
    schema: pa.Schema = pf.read_row_groups([], columns=wanted).schema
    for f in schema:
        column_kind(f.type, f.name)  # refuse before allocating anything
    total = sum(pf.metadata.row_group(g).num_rows for g in groups)
    transfer = open_transfer(domain, timing=timing, slot_bytes=slot_bytes)
    stop = threading.Event()
    pipe: queue.Queue[Any] = queue.Queue(maxsize=1)
    worker = threading.Thread(
        target=_decoder, args=(pf, groups, wanted, pipe, stop, stats), daemon=True
    )
    builders: list[ColumnBuilder] = []
    try:
        builders.extend(ColumnBuilder(f, total, transfer) for f in schema)
        worker.start()
        while True:
            waited = time.perf_counter()
            item = pipe.get()
            stats.wait_seconds += time.perf_counter() - waited
            if item is _DONE:
                break
            if isinstance(item, BaseException):
                raise item
            rows, pieces = item
            for i, piece in enumerate(pieces):
                builders[i].add(piece)
            stats.row_groups += 1
            stats.rows += rows
            stats.host_bytes += sum(_piece_bytes(p) for p in pieces)
        result = [b.finish() for b in builders]
        transfer.finish()
    except BaseException:
        # The traceback keeps this frame (and the builders) alive: let go of
        # the device memory now, not when the exception is dropped.
        for builder in builders:
            builder.discard()
        raise
    finally:
        stop.set()
        if worker.ident is not None:
            worker.join()  # it must not read the file after the caller closes it
        transfer.close()
        stats.transfer.add(transfer.stats)
    stats.wall_seconds += time.perf_counter() - started
    return DeviceFrame(result, num_rows=total, domain=domain, metadata=schema.metadata)


def _piece_bytes(piece: HostPiece) -> int:
    extra = 0 if piece.dictionary is None else int(piece.dictionary.nbytes)
    return piece.nbytes + extra


def read_parquet(
    source: str | os.PathLike[str],
    *,
    domain: AllocationDomain,
    cache: Any = None,
    fs: Any = None,
    storage_options: dict[str, Any] | None = None,
    columns: Sequence[str] | None = None,
    row_groups: Sequence[int] | None = None,
    read_dictionary: Sequence[str] | None = None,
    stats: DecodeStats | None = None,
    slot_bytes: int | str = DEFAULT_SLOT_BYTES,
) -> DeviceFrame:
    """Open ``source`` through the lakehouse ``cache`` (default: the process's
    ``default_cache()``) and :func:`decode_parquet` it into ``domain``.

    The lakehouse read's diagnostics land in ``stats.lakehouse``.
    """
    if cache is None:
        from nexus_cache.lakehouse import default_cache

        cache = default_cache()
    stats = stats if stats is not None else DecodeStats()
    with cache.open(source, fs=fs, storage_options=storage_options) as handle:
        stats.lakehouse = handle.diagnostics
        return decode_parquet(
            handle,
            domain=domain,
            columns=columns,
            row_groups=row_groups,
            read_dictionary=read_dictionary,
            stats=stats,
            slot_bytes=slot_bytes,
        )
