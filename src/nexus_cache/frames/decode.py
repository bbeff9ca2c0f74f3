"""Decode Parquet into a :class:`DeviceFrame`, row group by row group.

Two stages run at once:

* a pool of decoder threads (:mod:`nexus_cache.frames._pool`) reads the
  projected columns of the row groups with PyArrow on the host (PyArrow
  decodes without holding the GIL), several row groups at once, and turns
  each into NumPy buffers; the decoded bytes in flight are bounded by a
  window, so host memory stays bounded whatever the file's size;
* the calling thread moves each decoded row group into the domain through a
  :class:`~nexus_cache.frames.staging.Transfer` (on CUDA: pinned staging
  slots and one stream, see :mod:`nexus_cache.frames.staging`).

So while row group *i* is copied to the device, the row groups after it are
decoded. A path, or a lakehouse read of local bytes (an entry, or a local
source read directly, with or without a cache root), gives every decoder
thread its own reader over one memory-mapped view of the file; any other
file object (a remote stream) is read by one decoder thread.
:func:`~nexus_cache.frames.read.read_parquet` opens a source through the
lakehouse cache and decodes it with :func:`decode_parquet`.
"""

from __future__ import annotations

import mmap
import operator
import os
import stat
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from nexus_cache.backends import AllocationDomain
from nexus_cache.errors import ConfigError, NexusCacheError, SourceFormatError
from nexus_cache.frames._builder import ColumnBuilder
from nexus_cache.frames._host import HostPiece
from nexus_cache.frames._page_engine import decode_page_columns, plan_page_columns
from nexus_cache.frames._pool import INLINE_BYTES, RowGroupPool, buffer_opener, decode_settings
from nexus_cache.frames.column import column_kind
from nexus_cache.frames.frame import DeviceFrame
from nexus_cache.frames.staging import DEFAULT_SLOT_BYTES, TransferStats, open_transfer

if TYPE_CHECKING:
    from nexus_cache.lakehouse import ReadDiagnostics

__all__ = ["DecodeStats", "decode_parquet", "decoded_schema"]


def decoded_schema(pf: pq.ParquetFile, columns: Sequence[str] | None) -> pa.Schema:
    """The schema :func:`decode_parquet` gives ``columns`` of ``pf``, from its footer
    alone; ConfigError for an unknown column, FrameTypeError for a type a device
    frame cannot hold."""
    wanted, _groups = _check_request(pf, columns, None)
    return _projected_schema(pf, wanted)


def _projected_schema(pf: pq.ParquetFile, wanted: Sequence[str] | None) -> pa.Schema:
    """The schema Arrow reads ``wanted`` (top-level names, known to the file) of ``pf``
    with: its reader's schema, projected (a name given twice is read once), not an
    empty read of the row groups."""
    full = pf.schema_arrow
    schema = (
        full
        if wanted is None
        else pa.schema([full.field(n) for n in dict.fromkeys(wanted)], metadata=full.metadata)
    )
    for f in schema:
        column_kind(f.type, f.name)
    return schema


@dataclass
class DecodeStats:
    """Where one decode spent its time (filled in when passed as ``stats=``).

    ``decode_seconds``: host decode time summed over the decoder threads
    (``decode_threads`` of them; so it can exceed the wall time); ``wait_seconds``:
    how long the copying thread waited for decoded row groups; ``transfer``:
    the host-to-device stage (on CUDA the copy engine's busy time, measured
    with CUDA events); ``wall_seconds``: the whole call; ``lakehouse``: the
    lakehouse read's ``ReadDiagnostics``; ``source``: the source cache's
    ``SourceDiagnostics`` (:func:`~nexus_cache.frames.read_cached_parquet`);
    ``paths``: each column's decoder, ``"gpu"`` (the page-decode kernels, pages
    decompressed on the device by nvCOMP), ``"gpu (host decompression)"``, or
    ``"host: "`` and why (see ``NEXUS_DECODE_ENGINE``); ``gpu_stages``: seconds
    of the GPU page decoder by stage, summed over its column chunks (``pack``:
    the host lays the pages out, decompressing them where nvCOMP cannot;
    ``transfer``: the copy to the device; ``decompress``: nvCOMP;
    ``decode``: the kernels), each stage waited for before the next.
    """

    row_groups: int = 0
    rows: int = 0
    decode_threads: int = 0
    host_bytes: int = 0
    decode_seconds: float = 0.0
    wait_seconds: float = 0.0
    wall_seconds: float = 0.0
    transfer: TransferStats = field(default_factory=TransferStats)
    lakehouse: ReadDiagnostics | None = None
    source: Any = None
    paths: dict[str, str] = field(default_factory=dict)
    gpu_stages: dict[str, float] = field(default_factory=dict)


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
    groups = _row_group_indices(row_groups, count)
    bad = [g for g in groups if not 0 <= g < count]
    if bad:
        raise ConfigError(f"row_groups {bad} do not exist; the file has {count} (0..{count - 1})")
    return columns, groups


def _row_group_indices(row_groups: Any, count: int) -> list[int]:
    """``row_groups`` as a list of ints; ConfigError for anything that is not a
    sequence of whole numbers (a float, a bool, a string: ``int()`` would read
    0.7 as row group 0 and "10" as row groups 1 and 0)."""
    accepted = f"use a list of row group indices (the file has {count})"
    if isinstance(row_groups, (str, bytes)) or not isinstance(row_groups, Iterable):
        raise ConfigError(f"row_groups={row_groups!r} is not accepted; {accepted}")
    groups = []
    for g in row_groups:
        try:
            if isinstance(g, bool):
                raise TypeError
            groups.append(operator.index(g))
        except TypeError:
            raise ConfigError(
                f"row_groups holds {g!r}, which is not a row group index; {accepted}"
            ) from None
    return groups


def _shared_bytes(source: Any, window: int) -> pa.Buffer | None:
    """One thread-safe view of the whole file, when there is one to have: a
    memory map of a local path, of a local lakehouse entry or of a regular
    file's descriptor (a local source the lakehouse reads directly, with or
    without a root, hands out its own), or, for a stream of at most ``window`` bytes (a remote
    read), its bytes read once. None otherwise: one reader then decodes."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            st = os.stat(path)
        except OSError:
            return None  # ParquetFile raises its own error for the path
        if not stat.S_ISREG(st.st_mode):
            # A FIFO or device would block the open or never end.
            raise SourceFormatError(
                f"{path!r} is not a regular file; point the read at Parquet files"
            )
        if st.st_size == 0:
            return None  # ParquetFile names the empty file
        return pa.memory_map(path).read_buffer()
    if getattr(source, "is_local", False) and callable(getattr(source, "buffer", None)):
        view = source.buffer()  # the pinned, re-checked lakehouse entry
        return pa.py_buffer(view) if len(view) else None
    try:
        fd = source.fileno()
        st = os.fstat(fd)
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        fd = None
    if fd is not None:
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return None
        return pa.py_buffer(mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ))
    size = getattr(source, "size", None)
    if isinstance(size, int) and 0 < size <= window and callable(getattr(source, "seek", None)):
        source.seek(0)
        data = source.read()
        return pa.py_buffer(data) if len(data) == size else None
    return None


def _source_name(source: Any) -> str:
    return str(getattr(source, "path", None) or getattr(source, "name", None) or source)


def _open(
    reader: Any,
    read_dictionary: Sequence[str] | None,
    source: Any,
    metadata: pq.FileMetaData | None = None,
) -> pq.ParquetFile:
    if isinstance(read_dictionary, (str, bytes)):  # "ab" would mean ['a', 'b']
        raise ConfigError(
            f"read_dictionary={read_dictionary!r} is not accepted; use a list of names"
        )
    try:
        return pq.ParquetFile(reader, metadata=metadata, read_dictionary=read_dictionary)
    except KeyError as exc:  # Arrow's reader looks each read_dictionary name up
        name = exc.args[0] if exc.args else "?"
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        raise ConfigError(
            f"read_dictionary names {name!r}, which is not a column of "
            f"{_source_name(source)!r}; name only columns the file has"
        ) from None
    except pa.ArrowInvalid as exc:
        raise SourceFormatError(
            f"{_source_name(source)!r} is not readable Parquet ({' '.join(str(exc).split())}); "
            "point the read at Parquet data"
        ) from exc


def decode_parquet(
    source: Any,
    *,
    domain: AllocationDomain,
    columns: Sequence[str] | None = None,
    row_groups: Sequence[int] | None = None,
    read_dictionary: Sequence[str] | None = None,
    stats: DecodeStats | None = None,
    slot_bytes: int | str = DEFAULT_SLOT_BYTES,
    threads: int | None = None,
    window_bytes: int | str | None = None,
    engine: str | None = None,
    metadata: pq.FileMetaData | None = None,
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
    FrameTypeError for types a frame cannot hold; ``engine`` (else
    ``NEXUS_DECODE_ENGINE``, else ``host``): ``host``, ``gpu`` or ``auto``,
    which columns the GPU page decoder takes (``stats.paths`` says). ``metadata``: the
    footer of ``source``, already parsed (e.g. to prune row groups by their
    statistics): it is neither read nor parsed again. On any error every device
    allocation made so far is dropped. Thread-safe: concurrent decodes (into
    one domain or several) each use their own staging and decoder threads.
    """
    timing = stats is not None
    stats = stats if stats is not None else DecodeStats()
    started = time.perf_counter()
    count, window = decode_settings(threads, window_bytes)
    shared = _shared_bytes(source, window)
    if shared is not None:
        pf = _open(pa.BufferReader(shared), read_dictionary, source, metadata)
        opener = buffer_opener(shared, read_dictionary, pf.metadata)
    else:
        pf = _open(source, read_dictionary, source, metadata)
        count = 1  # one reader, one file position

        def opener() -> pq.ParquetFile:
            return pf

    wanted, groups = _check_request(pf, columns, row_groups)
    schema = _projected_schema(pf, wanted)  # refuses before allocating anything
    total = sum(pf.metadata.row_group(g).num_rows for g in groups)
    plan = plan_page_columns(engine, domain, pf, shared, groups, schema, _source_name(source))
    stats.paths.update(plan.paths)
    host_fields = [f for f in schema if f.name not in plan.gpu]
    transfer = open_transfer(domain, timing=timing, slot_bytes=slot_bytes)
    lock = threading.Lock()

    def on_decoded(seconds: float) -> None:
        with lock:
            stats.decode_seconds += seconds

    pool = RowGroupPool(
        opener,
        pf,
        groups,
        [f.name for f in host_fields],
        threads=count,
        window_bytes=window,
        on_decoded=on_decoded,
        # threads the caller asked for are threads it gets
        inline_bytes=INLINE_BYTES if threads is None else 0,
    )
    stats.decode_threads = max(stats.decode_threads, pool.threads)
    builders: list[ColumnBuilder] = []
    on_device: dict[str, Any] = {}
    try:
        # the decoded pieces are this decode's alone: a host domain takes them as they are
        builders.extend(ColumnBuilder(f, total, transfer, adopt=True) for f in host_fields)
        on_device.update(
            decode_page_columns(
                plan,
                schema,
                domain,
                transfer=transfer,
                stages=stats.gpu_stages if timing else None,
            )
        )
        decoded = iter(pool)
        while True:
            waited = time.perf_counter()
            try:
                item = next(decoded, None)
            except (pa.ArrowInvalid, OSError) as exc:
                if not _data_error(exc, in_memory=shared is not None):
                    raise
                raise SourceFormatError(
                    f"{_source_name(source)!r} is corrupt: a column chunk does not decode "
                    f"({' '.join(str(exc).split())}); rewrite the file or read another"
                ) from exc
            stats.wait_seconds += time.perf_counter() - waited
            if item is None:
                break
            rows, pieces = item
            for i, piece in enumerate(pieces):
                builders[i].add(piece)
            stats.rows += rows
            stats.host_bytes += sum(_piece_bytes(p) for p in pieces)
        stats.row_groups += len(groups)
        built = iter([b.finish() for b in builders])
        result = [on_device[f.name] if f.name in on_device else next(built) for f in schema]
        transfer.finish()
    except BaseException:
        # The traceback keeps this frame (and the builders) alive: let go of
        # the device memory now, not when the exception is dropped.
        for builder in builders:
            builder.discard()
        on_device.clear()
        raise
    finally:
        pool.close()  # no decoder reads the file after the caller closes it
        transfer.close()
        stats.transfer.add(transfer.stats)
    stats.wall_seconds += time.perf_counter() - started
    return DeviceFrame(result, num_rows=total, domain=domain, metadata=schema.metadata)


def _data_error(exc: BaseException, *, in_memory: bool) -> bool:
    """Whether Arrow's error decoding a column chunk says the file is corrupt. Bytes
    read from memory (a memory map, a buffer) fail only for what they hold, so
    every ``OSError`` there is the data's (``Corrupt snappy compressed data``,
    ``Couldn't deserialize thrift``); from a stream an ``OSError`` may be the
    read's own. Our own errors (an entry that changed under the read) are not."""
    if isinstance(exc, NexusCacheError):
        return False
    return in_memory or isinstance(exc, pa.ArrowInvalid)


def _piece_bytes(piece: HostPiece) -> int:
    extra = 0 if piece.dictionary is None else int(piece.dictionary.nbytes)
    return piece.nbytes + extra
