"""``DeviceFrame``: named columns in device memory of one allocation domain."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa

from nexus_cache.backends import AllocationDomain
from nexus_cache.errors import FrameTypeError, LifecycleError
from nexus_cache.frames._builder import build_column
from nexus_cache.frames._copy import copy_columns, copy_stream, share_columns
from nexus_cache.frames._host import arrow_array
from nexus_cache.frames.column import DeviceColumn, column_kind
from nexus_cache.frames.owner import FrameOwner
from nexus_cache.frames.staging import open_transfer

__all__ = ["DeviceFrame"]


def _to_host(array: Any) -> np.ndarray:
    if isinstance(array, np.ndarray):
        return array
    return array.get()


class DeviceFrame:
    """An immutable table whose buffers live in one allocation domain.

    Columns keep their order and their Arrow fields (name, type, nullability,
    metadata), so :meth:`to_arrow` returns the schema :meth:`from_arrow` got.
    :meth:`slice` and :meth:`select` derive frames that share the buffers (no
    copy) and the :class:`FrameOwner`; :meth:`copy_into` makes an independent
    copy in another domain.

    Thread-safety: reading a frame from several threads is safe; release it
    once, from one place. After :meth:`release` its columns are gone.
    """

    __slots__ = (
        "__weakref__",
        "_columns",
        "_domain",
        "_finalizer",
        "_metadata",
        "_names",
        "_num_rows",
        "_owner",
    )

    def __init__(
        self,
        columns: Sequence[DeviceColumn],
        *,
        num_rows: int,
        domain: AllocationDomain,
        metadata: dict[bytes, bytes] | None = None,
        owner: FrameOwner | None = None,
    ) -> None:
        columns = tuple(columns)
        for column in columns:
            if column.length != num_rows:
                raise ValueError(
                    f"column {column.name!r} has {column.length} rows, the frame {num_rows}"
                )
        self._columns: tuple[DeviceColumn, ...] | None = columns
        #: each column name and the index of its first column, made when first needed
        self._names: dict[str, int] | None = None
        self._num_rows = num_rows
        self._domain = domain
        self._metadata = dict(metadata) if metadata else None
        self._owner = owner
        self._finalizer = None
        if owner is not None:
            owner.acquire()
            # Safety net: a frame dropped without release() still lets go.
            self._finalizer = weakref.finalize(self, owner.release)

    # -- construction ------------------------------------------------------------------

    @classmethod
    def from_arrow(
        cls, table: pa.Table | pa.RecordBatch, *, domain: AllocationDomain
    ) -> DeviceFrame:
        """Copy ``table`` into ``domain``. Raises FrameTypeError for unsupported types."""
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        elif not isinstance(table, pa.Table):
            raise FrameTypeError(
                f"DeviceFrame.from_arrow takes a pyarrow.Table or RecordBatch, not "
                f"{type(table).__name__}; make one first (pyarrow.table(...))"
            )
        for f in table.schema:
            column_kind(f.type, f.name)  # refuse before allocating anything
        transfer = open_transfer(domain)
        try:
            columns = [
                build_column(field, table.column(i), transfer)
                for i, field in enumerate(table.schema)
            ]
            transfer.finish()
        finally:
            transfer.close()
        return cls(columns, num_rows=table.num_rows, domain=domain, metadata=table.schema.metadata)

    # -- description -------------------------------------------------------------------

    def __repr__(self) -> str:
        if self._columns is None:
            return "DeviceFrame(released)"
        return (
            f"DeviceFrame(rows={self._num_rows}, columns={self.column_names}, "
            f"nbytes={self.nbytes}, device={self._domain.device_id})"
        )

    @property
    def columns(self) -> tuple[DeviceColumn, ...]:
        if self._columns is None:
            raise LifecycleError("this frame was released; its columns are gone")
        return self._columns

    @property
    def num_rows(self) -> int:
        return self._num_rows

    @property
    def num_columns(self) -> int:
        return len(self.columns)

    @property
    def column_names(self) -> list[str]:
        return [c.field.name for c in self.columns]

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([c.field for c in self.columns], metadata=self._metadata)

    @property
    def domain(self) -> AllocationDomain:
        return self._domain

    @property
    def owner(self) -> FrameOwner | None:
        return self._owner

    @property
    def released(self) -> bool:
        return self._columns is None

    @property
    def nbytes(self) -> int:
        """Bytes of the device buffers the frame references (views count their span)."""
        return sum(c.nbytes for c in self.columns)

    def device_arrays(self) -> tuple[Any, ...]:
        """Every device buffer the frame references, e.g. to attach to a cache entry."""
        return tuple(a for c in self.columns for a in c.device_arrays())

    def _name_index(self) -> dict[str, int]:
        """Each column name and the index of its first column (made once: the columns
        never change)."""
        names = self._names
        if names is None:
            names = {}
            for i, column in enumerate(self.columns):
                names.setdefault(column.field.name, i)
            self._names = names
        return names

    def columns_named(self, names: Iterable[str] | None = None) -> dict[str, DeviceColumn]:
        """The first column of each of ``names`` (None: of every name) that the frame
        holds, by name (a name it lacks is left out)."""
        columns = self.columns
        index = self._name_index()
        if names is None:
            return {name: columns[i] for name, i in index.items()}
        return {name: columns[index[name]] for name in names if name in index}

    def column(self, key: str | int) -> DeviceColumn:
        """The column at an index, or the first one of a name."""
        columns = self.columns
        if type(key) is str:  # the common look-up: one dict get
            found = (self._names or self._name_index()).get(key)
            if found is not None:
                return columns[found]
        if isinstance(key, int):
            if -len(columns) <= key < len(columns):
                return columns[key]
            raise IndexError(
                f"no column at index {key}; the frame has {len(columns)} columns: "
                f"{self.column_names}"
            )
        names = self._name_index()
        try:
            found = names.get(key)
        except TypeError:  # unhashable: no column's name
            found = None
        if found is None:
            raise KeyError(f"no column {key!r}; columns: {self.column_names}")
        return columns[found]

    # -- derived frames -------------------------------------------------------------

    def _derive(self, columns: Iterable[DeviceColumn], num_rows: int) -> DeviceFrame:
        return DeviceFrame(
            list(columns),
            num_rows=num_rows,
            domain=self._domain,
            metadata=self._metadata,
            owner=self._owner,
        )

    def slice(self, offset: int = 0, length: int | None = None) -> DeviceFrame:
        """Rows ``[offset, offset + length)`` (clamped like ``pyarrow.Table.slice``)."""
        if offset < 0 or (length is not None and length < 0):
            raise ValueError(f"slice offset={offset}, length={length}; both must be >= 0")
        start = min(offset, self._num_rows)
        stop = self._num_rows if length is None else min(start + length, self._num_rows)
        return self._derive((c.slice(start, stop) for c in self.columns), stop - start)

    def view(self) -> DeviceFrame:
        """The same rows and columns (no copy, the same owner), released on its own:
        ``select(column_names)`` with no look-up."""
        view = self._derive(self.columns, self._num_rows)
        view._names = self._name_index()  # the same columns: the same names, found once
        return view

    def select(self, columns: Sequence[str | int]) -> DeviceFrame:
        """A projection, in the order given (names or indices)."""
        return self._derive((self.column(k) for k in columns), self._num_rows)

    def with_owner(self, owner: FrameOwner) -> DeviceFrame:
        """The same rows and columns (no copy), held by ``owner`` instead."""
        return DeviceFrame(
            self.columns,
            num_rows=self._num_rows,
            domain=self._domain,
            metadata=self._metadata,
            owner=owner,
        )

    def copy_into(
        self, domain: AllocationDomain, *, owner: FrameOwner | None = None
    ) -> DeviceFrame:
        """An independent copy allocated in ``domain`` (same device), synchronized.

        This and :attr:`nbytes` / :meth:`device_arrays` make a frame a value the
        device caches can hold (``nexus_cache.device.DeviceValue``). The copy's
        buffers share one allocation (a slice of it keeps all of it alive); a
        frame made this way copies again in one memcpy. Slices are compacted:
        string bytes outside the rows are not copied.
        ``owner`` becomes the copy's owner (e.g. a pin kept until it is released).
        """
        stream = None if domain.host_memory else copy_stream(domain)
        columns = copy_columns(self.columns, self._domain, domain, stream)
        if stream is not None:
            stream.synchronize()
        return DeviceFrame(
            columns, num_rows=self._num_rows, domain=domain, metadata=self._metadata, owner=owner
        )

    def share_into(self, domain: AllocationDomain) -> DeviceFrame | None:
        """The same rows booked by ``domain`` with no copy, or None where that cannot
        be (then :meth:`copy_into`). Only between host-memory domains, for a
        compact frame whose every buffer is Arrow's memory (a decode's, or a host
        domain's allocation): nothing writes such a buffer once built, and nothing
        reuses its memory while any array references it, so the two frames read
        the same bytes with lifetimes of their own. The new frame's buffers are
        read-only. A source-cache entry of a host decode is made this way.
        """
        if not (self._domain.host_memory and domain.host_memory):
            return None
        columns = share_columns(self.columns, self._domain, domain)
        if columns is None:
            return None
        return DeviceFrame(
            columns, num_rows=self._num_rows, domain=domain, metadata=self._metadata
        )

    # -- back to Arrow -----------------------------------------------------------------

    def to_arrow(self) -> pa.Table:
        """A host ``pyarrow.Table`` equal to the one the frame came from."""
        arrays = [_column_to_arrow(c) for c in self.columns]
        if not arrays:
            # No column carries the row count: project a column of nulls away (a
            # zero-column table made any other way has no rows).
            rows = pa.schema([("rows", pa.null())], metadata=self._metadata)
            return pa.Table.from_arrays([pa.nulls(self._num_rows)], schema=rows).select([])
        return pa.Table.from_arrays(arrays, schema=self.schema)

    # -- release ---------------------------------------------------------------------------

    def release(self) -> None:
        """Drop the columns and let go of the owner. Idempotent."""
        self._columns = None
        if self._finalizer is not None:
            self._finalizer()  # runs owner.release() once

    def __enter__(self) -> DeviceFrame:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _column_to_arrow(column: DeviceColumn) -> pa.Array:
    dictionary = None if column.dictionary is None else _column_to_arrow(column.dictionary)
    return arrow_array(
        column.type,
        column.length,
        _to_host(column.data),
        None if column.offsets is None else _to_host(column.offsets),
        None if column.validity is None else _to_host(column.validity),
        dictionary,
    )
