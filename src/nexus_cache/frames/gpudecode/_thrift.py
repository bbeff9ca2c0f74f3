"""A small, bounded reader of the Thrift compact protocol (Parquet page headers).

Only what Parquet's ``PageHeader`` needs: structs of integers, booleans and
nested structs, with every other field (binary statistics, lists, maps)
skipped. Every read is bounded by the buffer it was given, varints by ten
bytes and nesting by :data:`MAX_DEPTH`, so hostile bytes end in
:class:`ThriftError` after at most one pass over the buffer; never a loop
or an allocation larger than the input. Stateless and thread-safe.

Written for speed in plain Python (a row group has thousands of page
headers): a schema compiled once to a tuple indexed by field id, one loop
per struct over local variables, a varint's one-byte case inline, no call
per byte; a read past the end is caught once (IndexError of the buffer cut
at ``end``) instead of checked before every byte.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BOOL",
    "I32",
    "MAX_DEPTH",
    "STRUCT",
    "Schema",
    "ThriftError",
    "compile_schema",
    "read_fields",
    "read_struct",
]

#: Deepest nesting of structs, lists and maps accepted (a page header needs 3).
MAX_DEPTH = 16

_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE = 0, 1, 2, 3, 4, 5, 6, 7
_BINARY, _LIST, _SET, _MAP, _STRUCT = 8, 9, 10, 11, 12
_BOOLEANS = frozenset((_TRUE, _FALSE))
_ONE_BYTE = frozenset((_TRUE, _FALSE, _BYTE))  # inside lists and maps
_COLLECTIONS = frozenset((_LIST, _SET))

#: the types a schema names a kept field by: a 32-bit integer, a boolean, a struct
I32, BOOL, STRUCT = "i32", "bool", "struct"
_TYPES = {I32: _I32, BOOL: _TRUE}

#: A compiled schema (:func:`compile_schema`): by field id, the compact type
#: kept (of a 32-bit integer or a boolean), a nested struct's schema, or None.
Schema = tuple[Any, ...]


class ThriftError(ValueError):
    """The bytes are not a well-formed compact-protocol struct; ``offset`` is where."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(f"{message} at byte {offset}")
        self.offset = offset


def _varint(buf: Any, pos: int) -> tuple[int, int]:
    """``(value, next)``: the unsigned varint at ``buf[pos]`` (at most 10 bytes)."""
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    start, value, shift = pos, b & 0x7F, 7
    while True:
        pos += 1
        b = buf[pos]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos + 1
        shift += 7
        if shift >= 70:
            raise ThriftError("Thrift varint longer than 10 bytes", start)


def _zigzag(buf: Any, pos: int) -> tuple[int, int]:
    """``(value, next)``: the zigzag varint (a compact-protocol integer) at ``buf[pos]``."""
    v, pos = _varint(buf, pos)
    return (v >> 1) ^ -(v & 1), pos


def _advance(pos: int, count: int, end: int) -> int:
    if count < 0 or pos + count > end:
        raise ThriftError(f"Thrift length {count} runs past the data", pos)
    return pos + count


def _skip(buf: Any, pos: int, end: int, kind: int, depth: int) -> int:
    """The offset just past one value of compact type ``kind`` at ``buf[pos]``
    (``depth``: the nesting it is at). A boolean takes a byte (inside lists
    and maps; a boolean field's value is its type and never comes here)."""
    if kind in _ONE_BYTE:
        buf[pos]  # the byte must be there
        return pos + 1
    if _I16 <= kind <= _I64:
        return _varint(buf, pos)[1]
    if kind == _DOUBLE:
        return _advance(pos, 8, end)
    if kind == _BINARY:
        size, pos = _varint(buf, pos)
        return _advance(pos, size, end)
    if depth >= MAX_DEPTH:
        raise ThriftError(f"Thrift nesting deeper than {MAX_DEPTH}", pos)
    if kind == _STRUCT:
        return _skip_struct(buf, pos, end, depth + 1)
    if kind in _COLLECTIONS:
        head = buf[pos]
        pos += 1
        size, element = head >> 4, head & 0x0F
        if element > _STRUCT:  # Thrift refuses an unknown element type, even of no elements
            raise ThriftError(f"unknown Thrift type {element}", pos - 1)
        if size == 15:
            size, pos = _varint(buf, pos)
        if size > end - pos:  # each element takes at least one byte
            raise ThriftError(f"Thrift list of {size} elements runs past the data", pos)
        for _ in range(size):
            pos = _skip(buf, pos, end, element, depth + 1)
        return pos
    if kind == _MAP:
        size, pos = _varint(buf, pos)
        if size:
            if 2 * size > end - pos:
                raise ThriftError(f"Thrift map of {size} entries runs past the data", pos)
            types = buf[pos]
            pos += 1
            for _ in range(size):
                pos = _skip(buf, pos, end, types >> 4, depth + 1)
                pos = _skip(buf, pos, end, types & 0x0F, depth + 1)
        return pos
    raise ThriftError(f"unknown Thrift type {kind}", pos - 1)


def _skip_struct(buf: Any, pos: int, end: int, depth: int) -> int:
    """The offset just past the struct at ``buf[pos]`` (``depth``: its nesting),
    none of whose fields is kept (a page's statistics): :func:`_struct`'s loop
    without a schema, its common fields read inline."""
    while True:
        head = buf[pos]
        pos += 1
        kind = head & 0x0F
        if kind == _BINARY:
            if head < 0x10:
                pos = _varint(buf, pos)[1]
            count = buf[pos]
            if count < 0x80:
                pos += 1
            else:
                count, pos = _varint(buf, pos)
            if pos + count > end:
                raise ThriftError(f"Thrift length {count} runs past the data", pos)
            pos += count
            continue
        if kind == _STOP:
            return pos
        if head < 0x10:  # the long form: the id follows, a zigzag varint
            pos = _varint(buf, pos)[1]
        if kind in _BOOLEANS:  # a boolean field's value is its type
            continue
        if _I16 <= kind <= _I64 and buf[pos] < 0x80:
            pos += 1
        else:
            pos = _skip(buf, pos, end, kind, depth)


def _struct(buf: Any, pos: int, end: int, depth: int, schema: Schema) -> tuple[list[Any], int]:
    """The struct at ``buf[pos]`` as a list by field id (None where absent), and
    the offset past it; see :func:`read_fields`."""
    size = len(schema)
    fields: list[Any] = [None] * size
    last = 0
    while True:
        head = buf[pos]
        pos += 1
        kind = head & 0x0F
        if kind == _STOP:
            return fields, pos
        if head >= 0x10:
            last += head >> 4
        else:  # the long form: the id follows, a zigzag varint
            last, pos = _zigzag(buf, pos)
        want = schema[last] if 0 <= last < size else None
        if kind == _I32 and want == _I32:  # a zigzag varint, inline
            start, b, shift = pos, buf[pos], 7
            pos += 1
            value = b & 0x7F
            while b >= 0x80:
                if shift >= 70:
                    raise ThriftError("Thrift varint longer than 10 bytes", start)
                b = buf[pos]
                pos += 1
                value |= (b & 0x7F) << shift
                shift += 7
            fields[last] = (value >> 1) ^ -(value & 1)
        elif kind in _BOOLEANS:  # a boolean field's value is its type
            if want == _TRUE:
                fields[last] = kind == _TRUE
        elif kind == _STRUCT:
            if depth >= MAX_DEPTH:
                raise ThriftError(f"Thrift nesting deeper than {MAX_DEPTH}", pos)
            if type(want) is tuple:
                fields[last], pos = _struct(buf, pos, end, depth + 1, want)
            else:  # a struct not kept (a page's statistics)
                pos = _skip_struct(buf, pos, end, depth + 1)
        else:  # not kept, or of another type than the schema's: read past it
            pos = _skip(buf, pos, end, kind, depth)


def compile_schema(schema: dict[int, Any]) -> Schema:
    """The :data:`Schema` of ``schema`` (field id >= 0 -> :data:`I32`,
    :data:`BOOL`, or a nested struct's schema, a dict), for :func:`read_fields`.
    A field of any other type (None) is read past."""
    out: list[Any] = [None] * (max(schema, default=-1) + 1)
    for field, want in schema.items():
        if field < 0:
            raise ValueError(f"Thrift field id {field} in a schema; ids are >= 0")
        out[field] = compile_schema(want) if isinstance(want, dict) else _TYPES.get(want)
    return tuple(out)


def read_fields(buf: Any, pos: int, end: int, schema: Schema) -> tuple[list[Any], int]:
    """``(fields, next)``: the struct starting at ``buf[pos]`` (read no further
    than ``end``) as a list by field id of the fields ``schema`` (from
    :func:`compile_schema`) keeps, None where one is absent, and the offset
    just past it. Integers are ints, booleans bools, kept structs lists (by
    their nested schema). A field of another type than its schema's is read
    past and dropped, as Thrift's generated readers do (a required one is
    then missing); so is every field the schema does not keep. ``buf``:
    bytes, or a memoryview of bytes. Raises :class:`ThriftError` on
    malformed bytes."""
    end = min(end, len(buf))
    if end < len(buf):
        buf = buf[:end]
    try:
        return _struct(buf, pos, end, 1, schema)
    except IndexError:  # a read at the end: the bytes stop inside the struct
        raise ThriftError("truncated Thrift data", end) from None


def read_struct(
    buf: Any, pos: int, end: int, schema: dict[int, Any]
) -> tuple[dict[int, Any], int]:
    """:func:`read_fields` with ``schema`` (a dict, compiled here) and the
    fields present as ``{field id: value}``, nested structs as dicts too."""
    fields, after = read_fields(buf, pos, end, compile_schema(schema))
    return _as_dict(fields), after


def _as_dict(fields: list[Any]) -> dict[int, Any]:
    return {
        i: _as_dict(v) if isinstance(v, list) else v for i, v in enumerate(fields) if v is not None
    }
