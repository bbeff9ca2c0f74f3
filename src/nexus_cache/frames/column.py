"""One column of a device frame: its Arrow field and its device buffers.

Layout per kind (all buffers are 1-D arrays of the domain's array module):

==============  =====================================================  ==============
kind            buffers                                                Arrow types
==============  =====================================================  ==============
``fixed``       ``data``: one value per row, in the storage dtype      ints, floats,
                                                                       date, time,
                                                                       timestamp,
                                                                       duration
``bool``        ``data``: one ``bool`` per row                         bool
``binary``      ``offsets`` (rows + 1, int32 or int64) and ``data``    string, binary,
                (``uint8``); row *i* is ``data[offsets[i]:offsets[i+1]]``  large_*
``dictionary``  ``data``: indices; ``dictionary``: a column of values  dictionary
==============  =====================================================  ==============

Every kind may carry ``validity``: one ``bool`` per row, ``True`` where the
row is valid. A column without one has no nulls. Offsets need not start at
0 (a slice shares its parent's bytes); copies start them at 0 again.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.types as pat

from nexus_cache.errors import FrameTypeError

__all__ = ["ColumnKind", "DeviceColumn", "column_kind", "storage_dtype"]


class ColumnKind(enum.Enum):
    FIXED = "fixed"
    BOOL = "bool"
    BINARY = "binary"
    DICTIONARY = "dictionary"


_SUPPORTED = (
    "int8..int64, uint8..uint64, float16/32/64, bool, date32/64, time32/64, timestamp "
    "(any unit and time zone), duration, string, large_string, binary, large_binary, "
    "and dictionaries of these"
)


def _is_fixed(arrow_type: pa.DataType) -> bool:
    return bool(
        pat.is_integer(arrow_type)
        or pat.is_floating(arrow_type)
        or pat.is_date(arrow_type)
        or pat.is_time(arrow_type)
        or pat.is_timestamp(arrow_type)
        or pat.is_duration(arrow_type)
    )


def column_kind(arrow_type: pa.DataType, name: str = "?") -> ColumnKind:
    """The device layout of ``arrow_type``; :class:`FrameTypeError` when none fits."""
    if _is_fixed(arrow_type):
        return ColumnKind.FIXED
    if pat.is_boolean(arrow_type):
        return ColumnKind.BOOL
    if (
        pat.is_string(arrow_type)
        or pat.is_large_string(arrow_type)
        or pat.is_binary(arrow_type)
        or pat.is_large_binary(arrow_type)
    ):
        return ColumnKind.BINARY
    if pat.is_dictionary(arrow_type):
        value_kind = column_kind(arrow_type.value_type, name)
        if value_kind is ColumnKind.DICTIONARY:
            raise FrameTypeError(f"column {name!r}: a dictionary of dictionaries is not supported")
        return ColumnKind.DICTIONARY
    raise FrameTypeError(
        f"column {name!r} has Arrow type {arrow_type}, which a device frame cannot hold; "
        f"supported: {_SUPPORTED}. Project it away or cast it first."
    )


def storage_dtype(arrow_type: pa.DataType) -> np.dtype[Any]:
    """NumPy dtype of the values buffer of a fixed, bool or binary-offsets column."""
    if pat.is_boolean(arrow_type):
        return np.dtype(np.bool_)
    if pat.is_floating(arrow_type):
        return np.dtype(arrow_type.to_pandas_dtype())
    if pat.is_integer(arrow_type):
        return np.dtype(arrow_type.to_pandas_dtype())
    if _is_fixed(arrow_type):  # temporal: stored as its signed integer
        return np.dtype(f"int{arrow_type.bit_width}")
    if pat.is_large_string(arrow_type) or pat.is_large_binary(arrow_type):
        return np.dtype(np.int64)
    if column_kind(arrow_type) is ColumnKind.BINARY:
        return np.dtype(np.int32)
    raise FrameTypeError(f"Arrow type {arrow_type} has no single storage dtype")


@dataclass(frozen=True, eq=False)
class DeviceColumn:
    """Immutable description of one column's device buffers (see the module doc).

    ``field`` keeps the name, type, nullability and metadata, so the column
    converts back to exactly the Arrow type it came from. ``compact`` says
    that the offsets start at 0 and ``data`` holds exactly the rows' bytes
    (true for every built or copied column; a slice of strings is not), so
    a copy needs no look at the offsets.
    """

    field: pa.Field
    length: int
    data: Any
    offsets: Any = None
    validity: Any = None
    dictionary: DeviceColumn | None = None
    compact: bool = True

    @property
    def name(self) -> str:
        return str(self.field.name)

    @property
    def type(self) -> pa.DataType:
        return self.field.type

    @functools.cached_property
    def kind(self) -> ColumnKind:
        """The column's layout (:func:`column_kind` of its type), found once: a
        column never changes, and a resident entry's columns are read by every query."""
        return column_kind(self.field.type, self.name)

    def device_arrays(self) -> tuple[Any, ...]:
        """Every non-empty device buffer this column references (dictionary values
        included); empty buffers own no allocation."""
        own = tuple(
            a for a in (self.data, self.offsets, self.validity) if a is not None and a.size
        )
        return own + (self.dictionary.device_arrays() if self.dictionary is not None else ())

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers it references (a slice counts its views)."""
        return sum(int(a.nbytes) for a in self.device_arrays())

    def slice(self, start: int, stop: int) -> DeviceColumn:
        """Rows ``[start, stop)`` as views of the same buffers (no copy)."""
        validity = None if self.validity is None else self.validity[start:stop]
        if self.offsets is not None:
            whole = self.compact and start == 0 and stop == self.length
            offsets = self.offsets[start : stop + 1]
            return DeviceColumn(
                self.field, stop - start, self.data, offsets, validity, None, whole
            )
        return DeviceColumn(
            self.field, stop - start, self.data[start:stop], None, validity, self.dictionary
        )
