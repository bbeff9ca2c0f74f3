"""The fingerprint of a query's result: SHA-256 over its schema and values.

Every attempt's evidence records the fingerprint of the table it returned
(see :mod:`nexus_cache.service.evidence`). Equal schemas and values give the
same digest however the table is chunked or sliced; the bytes under a null
do not count. Columns are hashed from their Arrow buffers where they lie
(no combine, IPC or bytes copies); a large result's columns are hashed on a
small thread pool (hashlib releases the GIL). Thread-safe.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import threading
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["table_fingerprint"]


def table_fingerprint(table: pa.Table) -> str:
    """SHA-256 over the schema and the values of ``table``, independent of chunking.

    Parameters
    ----------
    table : pyarrow.Table
        The table to fingerprint (a query's result).

    Returns
    -------
    str
        The hex digest; equal for equal schemas and values.

    Notes
    -----
    Each column is hashed from its Arrow buffers in place, with no copy of
    fixed-width values or string bytes: the value bytes, the lengths of
    string and binary values (so offsets and slices do not matter), and the
    validity where the column has nulls (the values under a null are not
    hashed). A dictionary column is hashed by its values (the schema names its
    dictionary type), whatever its dictionary holds besides them or in what
    order. A column of another type (nested) is hashed through its Arrow IPC
    form. The column digests and the row count are hashed with
    the schema (field metadata excluded). Columns of a large table are
    hashed on a few threads (SHA-256 releases the GIL).

    Examples
    --------
    >>> import pyarrow as pa
    >>> from nexus_cache.service import table_fingerprint
    >>> one = pa.table({"x": [1, 2, 3, 4]})
    >>> two = pa.Table.from_batches(one.to_batches(max_chunksize=2))
    >>> table_fingerprint(one) == table_fingerprint(two)
    True
    >>> len(table_fingerprint(one))
    64
    """
    digest = hashlib.sha256(table.schema.to_string(show_schema_metadata=False).encode())
    columns = table.columns
    if table.nbytes >= _PARALLEL_HASH_BYTES and len(columns) > 1 and (os.cpu_count() or 1) > 1:
        later = [_hash_pool().submit(_column_digest, c) for c in columns[1:]]
        parts = [_column_digest(columns[0]), *(f.result() for f in later)]
    else:
        parts = [_column_digest(c) for c in columns]
    for part in parts:
        digest.update(part)
    digest.update(str(table.num_rows).encode())
    return digest.hexdigest()


#: a table at least this large is fingerprinted a column per thread
_PARALLEL_HASH_BYTES = 4 << 20
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _hash_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that hash columns (started once: a thread per call costs more
    than hashing a few MiB)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            workers = min(4, os.cpu_count() or 1)
            _pool = concurrent.futures.ThreadPoolExecutor(workers, "nexus-fingerprint")
        return _pool


def _column_digest(column: pa.ChunkedArray) -> bytes:
    """One column's digest (see :func:`table_fingerprint`): the same for any chunking."""
    arrow_type = column.type
    if pa.types.is_dictionary(arrow_type):
        # by its values, not its dictionary: unused or reordered dictionary entries (an
        # empty result keeps its source's dictionary, or not) are no different answer
        arrow_type = arrow_type.value_type
        column = pa.chunked_array([c.dictionary_decode() for c in column.chunks], arrow_type)
    if not _hashed_in_place(arrow_type):
        return _ipc_digest(column)
    values = hashlib.sha256()
    lengths = hashlib.sha256()
    validity = hashlib.sha256() if column.null_count else None
    for chunk in column.chunks:
        if not len(chunk):
            continue
        if validity is not None:
            valid = chunk.is_valid().to_numpy(zero_copy_only=False)
            validity.update(memoryview(valid.view(np.uint8)))
            if chunk.null_count:
                chunk = chunk.drop_null()
                if not len(chunk):
                    continue
        _hash_values(chunk, values, lengths)
    out = hashlib.sha256(b"in-place/1")
    for part in (values, lengths, validity):
        out.update(b"-" if part is None else part.digest())
    return out.digest()


def _hashed_in_place(arrow_type: pa.DataType) -> bool:
    """Whether a column of ``arrow_type`` is hashed from its buffers (no IPC form)."""
    if pa.types.is_boolean(arrow_type) or _is_binary_like(arrow_type):
        return True
    return (
        pa.types.is_primitive(arrow_type)
        and not pa.types.is_null(arrow_type)
        and arrow_type.bit_width % 8 == 0
    )


def _is_binary_like(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_binary(arrow_type)
        or pa.types.is_large_binary(arrow_type)
    )


def _hash_values(chunk: pa.Array, values: Any, lengths: Any) -> None:
    """Feed the values of ``chunk`` (no nulls) into ``values`` (and string lengths
    into ``lengths``), reading its buffers where they are."""
    arrow_type = chunk.type
    n, offset = len(chunk), chunk.offset
    if pa.types.is_boolean(arrow_type):  # bit-packed: one byte per value
        values.update(memoryview(chunk.to_numpy(zero_copy_only=False).view(np.uint8)))
        return
    buffers = chunk.buffers()
    if _is_binary_like(arrow_type):
        wide = pa.types.is_large_string(arrow_type) or pa.types.is_large_binary(arrow_type)
        offsets = np.frombuffer(buffers[1], dtype=np.int64 if wide else np.int32)
        offsets = offsets[offset : offset + n + 1]
        lengths.update(np.diff(offsets).astype(np.int64, copy=False).data)
        start, stop = int(offsets[0]), int(offsets[-1])
        if stop > start:
            values.update(memoryview(buffers[2])[start:stop])
        return
    width = arrow_type.bit_width // 8
    values.update(memoryview(buffers[1])[offset * width : (offset + n) * width])


def _ipc_digest(column: pa.ChunkedArray) -> bytes:
    """A column's digest through the Arrow IPC form of its chunks combined."""
    combined = pa.chunked_array(column.chunks, type=column.type).combine_chunks()
    sink = pa.BufferOutputStream()
    batch = pa.record_batch([combined], names=["v"])
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return hashlib.sha256(b"ipc/1" + sink.getvalue().to_pybytes()).digest()
