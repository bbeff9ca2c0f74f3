"""The compact-protocol reader against the tests' own writer: random structs of
every Thrift type (lists, sets and maps of structs, doubles, binaries,
long-form and negative field ids, fields kept and of the wrong type) read as
Thrift's generated readers read them, every truncation refused; and page
headers read without a Python call per byte."""

from __future__ import annotations

import io
import struct
import sys
from types import FrameType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_cache.errors import SourceFormatError
from nexus_cache.frames.gpudecode import ChunkSpec, chunk_spec, read_pages
from nexus_cache.frames.gpudecode._thrift import BOOL, I32, ThriftError, read_struct

# compact types
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE = 1, 2, 3, 4, 5, 6, 7
_BINARY, _LIST, _SET, _MAP, _STRUCT = 8, 9, 10, 11, 12
_KINDS = {"bool": _TRUE, "byte": _BYTE, "i16": _I16, "i32": _I32, "i64": _I64}
_KINDS |= {"double": _DOUBLE, "binary": _BINARY, "list": _LIST, "set": _SET}
_KINDS |= {"map": _MAP, "struct": _STRUCT}


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _zz(n: int) -> bytes:
    return _varint((n << 1) ^ (n >> 63))


def _write(value: tuple[str, Any]) -> bytes:
    """A value's bytes (a boolean as an element of a list or map: one byte)."""
    kind, v = value
    if kind == "bool":
        return bytes([_TRUE if v else _FALSE])
    if kind == "byte":
        return bytes([v])
    if kind in ("i16", "i32", "i64"):
        return _zz(v)
    if kind == "double":
        return struct.pack("<d", v)
    if kind == "binary":
        return _varint(len(v)) + v
    if kind in ("list", "set"):
        element, items = v
        head = bytes([len(items) << 4 | _KINDS[element]]) if len(items) < 15 else None
        head = head or bytes([0xF0 | _KINDS[element]]) + _varint(len(items))
        return head + b"".join(_write((element, x)) for x in items)
    if kind == "map":
        (key, val), items = v
        if not items:
            return b"\x00"
        out = _varint(len(items)) + bytes([_KINDS[key] << 4 | _KINDS[val]])
        return out + b"".join(_write((key, k)) + _write((val, x)) for k, x in items)
    out, last = bytearray(), 0
    for fid, (fkind, fv) in v:
        code = (_TRUE if fv else _FALSE) if fkind == "bool" else _KINDS[fkind]
        if 0 < fid - last <= 15:
            out.append((fid - last) << 4 | code)
        else:
            out += bytes([code]) + _zz(fid)
        if fkind != "bool":  # a boolean field's value is its type
            out += _write((fkind, fv))
        last = fid
    return bytes(out + b"\x00")


_SCALARS: dict[str, st.SearchStrategy[Any]] = {
    "bool": st.booleans(),
    "byte": st.integers(0, 255),
    "i16": st.integers(-(1 << 15), (1 << 15) - 1),
    "i32": st.integers(-(1 << 31), (1 << 31) - 1),
    "i64": st.integers(-(1 << 63), (1 << 63) - 1),
    "double": st.floats(allow_nan=False),
    "binary": st.binary(max_size=40),
}


def _values(depth: int) -> st.SearchStrategy[tuple[str, Any]]:
    """A random typed value (containers down to ``depth`` levels)."""
    scalars = st.one_of([st.tuples(st.just(k), s) for k, s in _SCALARS.items()])
    if depth == 0:
        return scalars

    def collection(kind: str) -> st.SearchStrategy[Any]:
        element = st.sampled_from([*_SCALARS, "struct"])
        return element.flatmap(
            lambda e: st.tuples(st.just(e), st.lists(_typed(e, depth - 1), max_size=17))
        ).map(lambda v: (kind, v))

    maps = st.tuples(st.sampled_from([*_SCALARS]), st.sampled_from([*_SCALARS, "struct"])).flatmap(
        lambda kv: st.tuples(
            st.just(kv),
            st.lists(st.tuples(_typed(kv[0], 0), _typed(kv[1], depth - 1)), max_size=4),
        )
    )
    return st.one_of(
        scalars,
        collection("list"),
        collection("set"),
        maps.map(lambda v: ("map", v)),
        _structs(depth - 1).map(lambda v: ("struct", v)),
    )


def _typed(kind: str, depth: int) -> st.SearchStrategy[Any]:
    """A raw value of ``kind`` (a struct: its fields)."""
    return _SCALARS[kind] if kind in _SCALARS else _structs(max(depth, 0))


def _structs(depth: int) -> st.SearchStrategy[list[tuple[int, tuple[str, Any]]]]:
    """A struct's fields: ids mostly those the schema keeps, some far or negative
    (the long form), repeats and descending ids allowed."""
    ids = st.one_of(st.integers(1, 4), st.integers(-40, 300))
    return st.lists(st.tuples(ids, _values(depth)), max_size=8)


_SCHEMA = {1: I32, 2: BOOL, 3: {1: I32, 2: BOOL, 3: {1: I32}}, 4: I32}


def _expected(fields: list[tuple[int, tuple[str, Any]]], schema: dict[int, Any]) -> dict[int, Any]:
    """What a generated reader keeps: fields of the schema's ids and types, the last wins."""
    out: dict[int, Any] = {}
    for fid, (kind, v) in fields:
        want = schema.get(fid)
        if (want, kind) in ((I32, "i32"), (BOOL, "bool")):
            out[fid] = v
        elif isinstance(want, dict) and kind == "struct":
            out[fid] = _expected(v, want)
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=_structs(3), tail=st.binary(max_size=8))
def test_random_structs_read_as_thrift_reads_them(
    fields: list[tuple[int, tuple[str, Any]]], tail: bytes
) -> None:
    raw = _write(("struct", fields))
    got, after = read_struct(memoryview(raw + tail), 0, len(raw) + len(tail), _SCHEMA)
    assert (got, after) == (_expected(fields, _SCHEMA), len(raw))
    # bytes as well as memoryviews, from an offset
    got, after = read_struct(b"\x07" + raw, 1, len(raw) + 1, _SCHEMA)
    assert after == len(raw) + 1


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=_structs(3), data=st.data())
def test_every_truncation_is_refused(fields: list[tuple[int, tuple[str, Any]]], data: Any) -> None:
    raw = _write(("struct", fields))
    cut = data.draw(st.integers(0, len(raw) - 1))
    # cut short by ``end`` (the bytes go on), or by the buffer itself
    for buf, end in ((raw, cut), (raw[:cut], len(raw))):
        with pytest.raises(ThriftError) as refused:
            read_struct(memoryview(buf), 0, end, _SCHEMA)
        assert refused.value.offset <= cut


def test_unknown_nested_fields_around_a_page_header_are_skipped() -> None:
    # lists of structs, a map of lists, a set of doubles, a deep struct and
    # booleans in a list, at every level of a v1 data page header
    junk: list[tuple[int, tuple[str, Any]]] = [
        (9, ("list", ("struct", [[(1, ("i64", -(1 << 62))), (2, ("binary", b"x" * 300))]] * 16))),
        (10, ("map", (("binary", "list"), [(b"k", ("bool", [True, False] * 9))]))),
        (11, ("set", ("double", [1.5, -2.0]))),
        (12, ("struct", [(1, ("struct", [(1, ("struct", [(7, ("i32", 1))]))]))])),
        (13, ("list", ("bool", [True, False, True]))),
    ]
    stats = [(1, ("binary", b"\xff" * 200)), (3, ("i64", 7)), (7, ("bool", True))]
    v1 = [
        (1, ("i32", 3)),
        (2, ("i32", 0)),
        (3, ("i32", 3)),
        (4, ("i32", 3)),
        (5, ("struct", stats)),
        *junk,
    ]
    payload = b"abc"
    header = [
        (1, ("i32", 0)),
        (2, ("i32", 3)),
        (3, ("i32", 3)),
        *junk,
        (5, ("struct", v1)),
        (-2, ("struct", v1)),  # a negative id (long form): not a field we read
        (300, ("i32", 1)),
    ]
    raw = _write(("struct", header))
    chunk = raw + payload
    spec = _spec(len(chunk), 3)
    (page,) = read_pages(chunk, spec)
    h = page.header
    assert (h.type, h.num_values, h.encoding, h.def_encoding, h.rep_encoding) == (0, 3, 0, 3, 3)
    assert (h.compressed_size, h.uncompressed_size, bytes(page.payload)) == (3, 3, payload)
    for cut in range(1, len(raw)):  # every truncated header is refused, by name
        short = _spec(cut, 3)
        with pytest.raises(SourceFormatError, match="unreadable page header"):
            read_pages(raw[:cut], short)


def _spec(size: int, values: int) -> ChunkSpec:
    return ChunkSpec(
        source="hand.parquet",
        column="x",
        row_group=0,
        start=0,
        size=size,
        num_values=values,
        uncompressed_size=1 << 20,
        codec="UNCOMPRESSED",
        physical_type="INT32",
        logical={"Type": "None"},
        max_def=0,
        max_rep=0,
        arrow_type=pa.int32(),
    )


def test_page_headers_are_read_without_a_python_call_per_byte() -> None:
    # string pages: headers with binary statistics (min and max) of ~40 bytes
    out = io.BytesIO()
    rng = np.random.default_rng(5)
    words = ["".join(map(chr, rng.integers(97, 123, 40))) for _ in range(64)]
    table = pa.table({"s": pa.array([words[i % 64] for i in range(20_000)])})
    pq.write_table(
        table,
        out,
        data_page_size=4096,
        write_batch_size=64,
        use_dictionary=False,
        compression="none",
    )
    raw = out.getvalue()
    spec = chunk_spec(pq.ParquetFile(io.BytesIO(raw)), 0, 0, "calls.parquet")
    chunk = raw[spec.start : spec.start + spec.size]
    calls = [0]

    def count(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            calls[0] += 1

    sys.setprofile(count)
    try:
        pages = read_pages(chunk, spec)
    finally:
        sys.setprofile(None)
    assert len(pages) > 50
    # a header of ~100 bytes: a handful of calls (per struct, per required
    # field's check, the page's tuples), not one per byte or per field
    assert calls[0] / len(pages) <= 20, f"{calls[0] / len(pages):.1f} calls a page"
