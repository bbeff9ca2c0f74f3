"""read_pages reads a chunk's headers straight into its PageTable: the same
pages, field by field, and the same refusals, as a walk page by page with the
general Thrift reader (the format's reading, the oracle here)."""

from __future__ import annotations

import dataclasses
import importlib
import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.frames.gpudecode.test_pages import corrupted

from nexus_cache.errors import SourceFormatError
from nexus_cache.frames.gpudecode import ChunkSpec, chunk_spec, read_pages
from nexus_cache.frames.gpudecode.pages import Page, PageList, PageTable, page_table
from nexus_cache.frames.gpudecode.support import pages_reason, unsupported_reason

_pages = importlib.import_module("nexus_cache.frames.gpudecode.pages")
_headers = importlib.import_module("nexus_cache.frames.gpudecode._page_headers")


def _walk(chunk: bytes, spec: ChunkSpec) -> list[Page]:
    """The pages of ``chunk`` read one by one by the general reader, with the
    checks and messages of a page walk (the oracle)."""
    data = memoryview(chunk)
    if len(data) != spec.size:
        raise SourceFormatError(
            f"{spec.where(spec.start)}: the column chunk is {len(data)} bytes, "
            f"the footer says {spec.size}; the file is truncated or corrupt"
        )
    pages, pos, values, inflated = [], 0, 0, 0
    while pos < len(data):
        header, body = _pages._general_header(data, pos, len(data), spec)
        end = body + header.compressed_size
        if end > len(data):
            raise SourceFormatError(
                f"{spec.where(spec.start + pos)}: a page of {header.compressed_size} bytes "
                "runs past the column chunk; the file is truncated or corrupt"
            )
        inflated += header.uncompressed_size
        if inflated > spec.uncompressed_size:
            raise SourceFormatError(
                f"{spec.where(spec.start + pos)}: the pages inflate past the "
                f"{spec.uncompressed_size} bytes the footer states; the file is corrupt"
            )
        pages.append(Page(header, spec.start + pos, data[body:end]))
        if header.type in (0, 3):
            values += header.num_values
        pos = end
    if values != spec.num_values:
        raise SourceFormatError(
            f"{spec.where(spec.start)}: the pages hold {values} values, the footer says "
            f"{spec.num_values}; the file is corrupt"
        )
    return pages


def _outcome(read: Any, chunk: bytes, spec: ChunkSpec) -> Any:
    try:
        return read(chunk, spec)
    except SourceFormatError as exc:
        return ("refused", str(exc))


def _assert_same(got: Any, want: Any, spec: ChunkSpec) -> None:
    """``got`` (read_pages') and ``want`` (the walk's): the same refusal, or the
    same pages field by field, and the same table."""
    if isinstance(want, tuple):
        assert got == want
        return
    assert isinstance(got, PageList)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.header == b.header
        assert a.offset == b.offset
        assert bytes(a.payload) == bytes(b.payload)
    for k, (a, b) in enumerate(zip(got, want, strict=True)):  # by index too
        assert got[k] == a
        assert got[k - len(got)].offset == b.offset
    expected = page_table(want)
    for name, a, b in zip(PageTable._fields, got.table, expected, strict=True):
        assert a.dtype == np.int64, name
        assert a.tolist() == b.tolist(), name
    assert pages_reason(spec, got) == pages_reason(spec, want)


def _check(chunk: bytes, spec: ChunkSpec) -> Any:
    got, want = _outcome(read_pages, chunk, spec), _outcome(_walk, chunk, spec)
    _assert_same(got, want, spec)
    return want


def _write(table: pa.Table, **options: Any) -> list[tuple[bytes, ChunkSpec]]:
    out = io.BytesIO()
    # small batches: the page size is checked per batch, so pages stay small
    pq.write_table(table, out, write_batch_size=32, **options)
    raw = out.getvalue()
    pf = pq.ParquetFile(io.BytesIO(raw))
    chunks = []
    for g in range(pf.num_row_groups):
        for c in range(pf.metadata.num_columns):
            spec = chunk_spec(pf, g, c, "table.parquet")
            chunks.append((raw[spec.start : spec.start + spec.size], spec))
    return chunks


def _columns(n: int, seed: int, long_strings: bool) -> pa.Table:
    rng = np.random.default_rng(seed)
    mask = rng.random(n) < 0.2
    width = 200 if long_strings else 12
    words = [f"w{'x' * int(rng.integers(0, width))}{i}" for i in range(n)]
    return pa.table(
        {
            "i32": pa.array(rng.integers(-50, 50, n, dtype=np.int32), mask=mask),
            "i64": pa.array(rng.integers(-(1 << 40), 1 << 40, n)),
            "f64": pa.array(rng.standard_normal(n), mask=mask),
            "flag": pa.array(rng.random(n) < 0.5, mask=mask),
            "s": pa.array(words, mask=mask),
            "cat": pa.array([f"c{i % 7}" for i in range(n)]).dictionary_encode(),
            "bin": pa.array([bytes([i % 256]) * (i % 5) for i in range(n)], pa.binary()),
        }
    )


_KINDS = [
    dict(data_page_version=v, use_dictionary=d, compression=c, write_statistics=s)
    for v in ("1.0", "2.0")
    for d in (True, False)
    for c in ("none", "snappy")
    for s in (True, False)
] + [dict(write_page_checksum=True, use_dictionary=d) for d in (True, False)]


@pytest.mark.parametrize("options", _KINDS, ids=lambda o: "-".join(map(str, o.values())))
def test_every_page_shape_reads_as_the_page_walk_does(options: dict[str, Any]) -> None:
    # v1 and v2 data pages, dictionary pages, statistics or none, long string
    # statistics (past the one-match reader's one-byte lengths): the same
    # pages, field by field, and the same table
    for long_strings in (False, True):
        table = _columns(700, 11, long_strings)
        for chunk, spec in _write(table, data_page_size=512, row_group_size=300, **options):
            assert not isinstance(_check(chunk, spec), tuple)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 400),
    seed=st.integers(0, 1000),
    page=st.sampled_from([64, 300, 4096]),
    version=st.sampled_from(["1.0", "2.0"]),
    dictionary=st.booleans(),
    codec=st.sampled_from(["none", "snappy", "gzip", "zstd"]),
    statistics=st.booleans(),
    long_strings=st.booleans(),
    checksums=st.booleans(),
)
def test_written_files_read_as_the_page_walk_does(
    n: int,
    seed: int,
    page: int,
    version: str,
    dictionary: bool,
    codec: str,
    statistics: bool,
    long_strings: bool,
    checksums: bool,
) -> None:
    chunks = _write(
        _columns(n, seed, long_strings),
        data_page_size=page,
        data_page_version=version,
        use_dictionary=dictionary,
        compression=codec,
        write_statistics=statistics,
        write_page_checksum=checksums,
    )
    for chunk, spec in chunks:
        _check(chunk, spec)


_CHUNKS = _write(_columns(600, 5, False), data_page_size=128, compression="snappy") + _write(
    _columns(600, 6, True), data_page_size=128, data_page_version="2.0"
)
_HEADERS = [[p.offset - spec.start for p in _walk(c, spec)] for c, spec in _CHUNKS]


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(0, len(_CHUNKS) - 1),
    edits=st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(-1, 60), st.integers(0, 255)),
        min_size=1,
        max_size=3,
    ),
    cut=st.integers(0, 40),
    values=st.integers(-2, 2),
)
def test_corrupt_and_truncated_headers_are_refused_as_the_page_walk_refuses(
    which: int, edits: list[tuple[int, int, int]], cut: int, values: int
) -> None:
    # a byte of a header changed (or anywhere), the chunk cut, the footer's
    # count off: the same pages, or the same refusal, the same message
    chunk, spec = _CHUNKS[which]
    data = corrupted(chunk, _HEADERS[which], edits, cut)
    spec = dataclasses.replace(spec, size=len(data), num_values=spec.num_values + values)
    _check(data, spec)


def test_a_chunk_of_the_wrong_size_is_refused_as_before() -> None:
    chunk, spec = _CHUNKS[0]
    got = _outcome(read_pages, chunk[:-1], spec)
    assert got == _outcome(_walk, chunk[:-1], spec)
    assert "the footer says" in got[1]


def test_the_walk_and_the_support_check_make_no_page_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the headers go straight into the table: no Page (nor PageHeader) a page,
    # for the walk and the support check; a page is made only when asked for
    chunk, spec = max(_CHUNKS, key=lambda item: len(_walk(*item)))

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a Page was made")

    monkeypatch.setattr(_pages, "Page", refuse)
    monkeypatch.setattr(_pages, "PageHeader", refuse)
    monkeypatch.setattr(_headers, "PageHeader", refuse)  # the readers' own
    pages = read_pages(chunk, spec)
    assert len(pages) > 5
    assert unsupported_reason(spec, pages) is None
    with pytest.raises(AssertionError, match="a Page was made"):
        pages[0]
