"""A small, bounded reader of the Thrift compact protocol (Parquet page headers).

Only what Parquet's ``PageHeader`` needs: structs of integers, booleans and
nested structs, with every other field (binary statistics, lists, maps)
skipped. Every read is bounded by the buffer it was given, varints by ten
bytes and nesting by :data:`MAX_DEPTH`, so hostile bytes end in
:class:`ThriftError` after at most one pass over the buffer; never a loop
or an allocation larger than the input. Stateless and thread-safe.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BOOL", "I32", "MAX_DEPTH", "STRUCT", "ThriftError", "read_struct"]

#: Deepest nesting of structs, lists and maps accepted (a page header needs 3).
MAX_DEPTH = 16

_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE = 0, 1, 2, 3, 4, 5, 6, 7
_BINARY, _LIST, _SET, _MAP, _STRUCT = 8, 9, 10, 11, 12
_INTEGERS = (_BYTE, _I16, _I32, _I64)

#: the types a schema names a kept field by: a 32-bit integer, a boolean, a struct
I32, BOOL, STRUCT = "i32", "bool", "struct"
_TYPES = {I32: _I32, BOOL: _TRUE, STRUCT: _STRUCT}


class ThriftError(ValueError):
    """The bytes are not a well-formed compact-protocol struct; ``offset`` is where."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(f"{message} at byte {offset}")
        self.offset = offset


class _Reader:
    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: memoryview, pos: int, end: int) -> None:
        self.buf, self.pos, self.end = buf, pos, end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise ThriftError("truncated Thrift data", self.pos)
        value = self.buf[self.pos]
        self.pos += 1
        return int(value)

    def varint(self) -> int:
        start, value, shift = self.pos, 0, 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift >= 70:
                raise ThriftError("Thrift varint longer than 10 bytes", start)

    def zigzag(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def skip(self, count: int) -> None:
        if count < 0 or self.pos + count > self.end:
            raise ThriftError(f"Thrift length {count} runs past the data", self.pos)
        self.pos += count


def _value(r: _Reader, kind: int, depth: int, schema: dict[int, Any] | None) -> Any:
    """Read one value of compact type ``kind``; structs with a ``schema`` become dicts."""
    if kind in (_TRUE, _FALSE):  # only inside lists: one byte each
        return r.byte() == 1
    if kind in _INTEGERS:
        return r.byte() if kind == _BYTE else r.zigzag()
    if kind == _DOUBLE:
        r.skip(8)
        return None
    if kind == _BINARY:
        r.skip(r.varint())
        return None
    if depth >= MAX_DEPTH:
        raise ThriftError(f"Thrift nesting deeper than {MAX_DEPTH}", r.pos)
    if kind == _STRUCT:
        return _struct(r, depth + 1, schema)
    if kind in (_LIST, _SET):
        head = r.byte()
        size, element = head >> 4, head & 0x0F
        if element > _STRUCT:  # Thrift refuses an unknown element type, even of no elements
            raise ThriftError(f"unknown Thrift type {element}", r.pos - 1)
        if size == 15:
            size = r.varint()
        if size > r.end - r.pos:  # each element takes at least one byte
            raise ThriftError(f"Thrift list of {size} elements runs past the data", r.pos)
        for _ in range(size):
            _value(r, element, depth + 1, None)
        return None
    if kind == _MAP:
        size = r.varint()
        if size:
            if 2 * size > r.end - r.pos:
                raise ThriftError(f"Thrift map of {size} entries runs past the data", r.pos)
            types = r.byte()
            for _ in range(size):
                _value(r, types >> 4, depth + 1, None)
                _value(r, types & 0x0F, depth + 1, None)
        return None
    raise ThriftError(f"unknown Thrift type {kind}", r.pos - 1)


def _kind(want: Any) -> int:
    """The compact type of a kept field of schema type ``want``."""
    return _STRUCT if isinstance(want, dict) else _TYPES[want]


def _struct(r: _Reader, depth: int, schema: dict[int, Any] | None) -> dict[int, Any]:
    """Fields of one struct by id. ``schema`` maps the ids kept to their type
    (:data:`I32`, :data:`BOOL`, or a nested struct's schema, a dict); other
    fields, and kept ones of another type, are read past and dropped."""
    fields: dict[int, Any] = {}
    last = 0
    while True:
        head = r.byte()
        kind = head & 0x0F
        if kind == _STOP:
            return fields
        delta = head >> 4
        field = last + delta if delta else r.zigzag()
        last = field
        want = schema.get(field) if schema is not None else None
        if kind in (_TRUE, _FALSE):  # a boolean field's value is its type
            value: Any = kind == _TRUE
        else:
            value = _value(r, kind, depth, want if isinstance(want, dict) else None)
        # a field of another type than its schema's is skipped, as Thrift's
        # generated readers do (a required one is then missing)
        if want is not None and _kind(want) == (_TRUE if kind == _FALSE else kind):
            fields[field] = value


def read_struct(
    buf: memoryview, pos: int, end: int, schema: dict[int, Any]
) -> tuple[dict[int, Any], int]:
    """``(fields, next)``: the struct starting at ``buf[pos]`` (read no further
    than ``end``) as ``{field id: value}`` for the ids in ``schema``, and the
    offset just past it (``schema``: id -> :data:`I32`, :data:`BOOL` or a nested
    schema). Integers are ints, booleans bools, kept structs dicts (by their
    nested schema). Raises :class:`ThriftError` on malformed bytes."""
    r = _Reader(buf, pos, min(end, len(buf)))
    fields = _struct(r, 1, schema)
    return fields, r.pos
