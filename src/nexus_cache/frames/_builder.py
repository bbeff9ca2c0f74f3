"""Assemble device columns from host pieces (row groups, or one whole table).

Fixed-width buffers (values, indices, offsets, validity) are allocated once
for all rows and each piece is copied straight to its rows (string offsets
are rebased in place, on the device). String bytes arrive per piece: on a
device, each piece's bytes go to their own allocation at once, and when
there was more than one they are joined on the device at the end (a
device-to-device copy, far cheaper than the host-to-device one); where the
domain's memory is host memory, the pieces are kept as they are and copied
once, into the joined buffer, at the end. The
dictionaries of a dictionary column stay on the host until the end: a piece
whose dictionary equals the previous one reuses it; otherwise its indices
are shifted on the device past the dictionaries before it, and the
dictionaries are concatenated once.

Every allocation goes through the domain (``domain.empty``) inside the
transfer's device scope. A builder made with ``adopt=True`` (its pieces are
buffers a decoder allocated for it alone) offers a piece that holds a whole
fixed-width column to the domain as the column's buffer
(``Transfer.adopt``): the host domain takes it as it is, with no allocation
and no copy; a device domain takes none, and the piece is copied as any.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from nexus_cache.errors import FrameTypeError
from nexus_cache.frames._host import HostPiece, host_piece
from nexus_cache.frames.column import ColumnKind, DeviceColumn, column_kind, storage_dtype
from nexus_cache.frames.staging import Transfer

__all__ = ["ColumnBuilder", "build_column", "check_dictionary_length"]


def check_dictionary_length(field: pa.Field, length: int) -> None:
    """FrameTypeError when the joined dictionaries of ``field`` (a dictionary
    column), ``length`` values in all, hold more than its indices can address."""
    limit = np.iinfo(field.type.index_type.to_pandas_dtype()).max
    if length - 1 > limit:
        raise FrameTypeError(
            f"column {field.name!r}: the row groups' dictionaries hold "
            f"{length} values, past {field.type.index_type} indices"
        )


class ColumnBuilder:
    """Builds one column of ``total`` rows from pieces added in row order.

    ``adopt``: the pieces are buffers decoded for this builder alone (nothing
    else reads, writes or frees them), so a fixed-width piece of all ``total``
    rows may become the column's buffer as it is (:meth:`Transfer.adopt`).
    """

    def __init__(
        self, field: pa.Field, total: int, transfer: Transfer, *, adopt: bool = False
    ) -> None:
        self._field = field
        self._kind = column_kind(field.type, field.name)
        self._total = total
        self._transfer = transfer
        self._row = 0
        domain = transfer.domain
        self._validity: Any = None
        self._offsets: Any = None
        self._pieces: list[Any] = []
        self._byte_base = 0
        self._dicts: list[pa.Array] = []
        self._dict_base = 0
        self._dict_len = 0
        with transfer.device():
            if self._kind is ColumnKind.DICTIONARY:
                self._data = domain.empty(total, np.dtype(field.type.index_type.to_pandas_dtype()))
            elif self._kind is ColumnKind.BINARY:
                self._offsets = domain.empty(total + 1, storage_dtype(field.type))
                self._offsets[:1] = 0
                self._data = None
            elif adopt and total and self._kind is ColumnKind.FIXED:
                self._data = None  # the first piece may be the whole column (see add)
            else:
                self._data = domain.empty(total, storage_dtype(field.type))

    def add(self, piece: HostPiece) -> None:
        n, row, transfer = piece.length, self._row, self._transfer
        if row + n > self._total:
            raise ValueError(
                f"column {self._field.name!r}: more rows than the {self._total} planned"
            )
        self._add_validity(piece, row)
        if self._kind is ColumnKind.BINARY:
            self._add_bytes(piece, row)
        else:
            if self._data is None:  # adopt=True: a piece of every row is taken as it is
                self._data = transfer.adopt(piece.data) if n == self._total else None
                if self._data is not None:
                    self._row = n
                    return
                with transfer.device():
                    self._data = transfer.domain.empty(
                        self._total, storage_dtype(self._field.type)
                    )
            transfer.to_device(piece.data, self._data[row : row + n])
        if self._kind is ColumnKind.DICTIONARY:
            self._add_dictionary(piece, row)
        self._row = row + n

    def _add_validity(self, piece: HostPiece, row: int) -> None:
        n, transfer = piece.length, self._transfer
        if piece.validity is None:
            if self._validity is not None and n:
                with transfer.device():
                    self._validity[row : row + n].fill(True)
            return
        if self._validity is None:
            with transfer.device():
                self._validity = transfer.domain.empty(self._total, np.bool_)
                self._validity[:row].fill(True)
        transfer.to_device(piece.validity, self._validity[row : row + n])

    def _add_bytes(self, piece: HostPiece, row: int) -> None:
        assert piece.offsets is not None
        transfer, n = self._transfer, piece.length
        nbytes = int(piece.data.nbytes)
        limit = np.iinfo(self._offsets.dtype).max
        if self._byte_base + nbytes > limit:
            raise FrameTypeError(
                f"column {self._field.name!r} holds more than {limit} bytes, past its "
                f"{self._field.type} offsets; read it as large_string/large_binary"
            )
        if transfer.host_memory:
            # Kept as it is and copied once, into the joined buffer, at the end.
            self._pieces.append(piece.data)
        else:
            with transfer.device():
                chunk = transfer.domain.empty(nbytes, np.uint8)
            transfer.to_device(piece.data, chunk)
            self._pieces.append(chunk)
        ends = self._offsets[row + 1 : row + n + 1]
        transfer.to_device(piece.offsets[1:], ends)
        if self._byte_base and n:
            # Rebased where they land: no shifted host copy of the offsets.
            with transfer.device():
                transfer.domain.xp.add(ends, ends.dtype.type(self._byte_base), out=ends)
        self._byte_base += nbytes

    def _add_dictionary(self, piece: HostPiece, row: int) -> None:
        assert piece.dictionary is not None
        values = piece.dictionary
        if not (self._dicts and values.equals(self._dicts[-1])):
            self._dict_base = self._dict_len
            self._dicts.append(values)
            self._dict_len += len(values)
        if self._dict_base and piece.length:
            check_dictionary_length(self._field, self._dict_len)
            view = self._data[row : row + piece.length]
            with self._transfer.device():
                self._transfer.domain.xp.add(view, view.dtype.type(self._dict_base), out=view)

    def discard(self) -> None:
        """Drop every buffer (after a failure), even if a traceback keeps the builder."""
        self._data = self._offsets = self._validity = None
        self._pieces = []
        self._dicts = []

    def finish(self) -> DeviceColumn:
        """The column (after the transfer's :meth:`~Transfer.finish`, it is complete)."""
        if self._row != self._total:
            raise ValueError(f"column {self._field.name!r}: {self._row} of {self._total} rows")
        transfer, data, dictionary = self._transfer, self._data, None
        if self._kind is ColumnKind.BINARY:
            data = self._join_bytes()
        elif self._kind is ColumnKind.DICTIONARY:
            values = (
                pa.concat_arrays(self._dicts)
                if self._dicts
                else pa.array([], type=self._field.type.value_type)
            )
            dictionary = build_column(pa.field("values", values.type), values, transfer)
        return DeviceColumn(
            self._field, self._total, data, self._offsets, self._validity, dictionary
        )

    def _join_bytes(self) -> Any:
        pieces, self._pieces = self._pieces, []
        transfer = self._transfer
        if transfer.host_memory:
            with transfer.device():
                joined = transfer.domain.empty(self._byte_base, np.uint8)
            at = 0
            for data in pieces:
                transfer.to_device(data, joined[at : at + data.nbytes])
                at += int(data.nbytes)
            return joined
        if len(pieces) == 1:
            return pieces[0]
        with transfer.device():
            joined = transfer.domain.empty(self._byte_base, np.uint8)
            at = 0
            for chunk in pieces:
                joined[at : at + chunk.nbytes] = chunk
                at += int(chunk.nbytes)
        return joined


def build_column(
    field: pa.Field, array: pa.Array | pa.ChunkedArray, transfer: Transfer
) -> DeviceColumn:
    """One column from one Arrow array, in one piece."""
    builder = ColumnBuilder(field, len(array), transfer)
    builder.add(host_piece(array, field.name))
    return builder.finish()
