"""The NumPy reference page decoder equals PyArrow's decode, bit for bit."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tests.frames.gpudecode._check import check_file

#: every codec PyArrow writes that the page decoder supports ("lz4" is LZ4_RAW)
CODECS = ["none", "snappy", "gzip", "zstd", "lz4"]
TYPES = [
    pa.int32(),
    pa.int64(),
    pa.float32(),
    pa.float64(),
    pa.date32(),
    pa.timestamp("ms"),
    pa.timestamp("us", tz="UTC"),
    pa.timestamp("ns"),
    pa.bool_(),
    pa.string(),
    pa.large_string(),
    pa.binary(),
]


@st.composite
def columns(draw: Any, n: int) -> pa.Array:
    arrow_type = draw(st.sampled_from(TYPES))
    density = draw(st.sampled_from(["none", "some", "all"]))
    mask = None
    if density == "all":
        mask = np.ones(n, np.bool_)
    elif density == "some":
        mask = draw(hnp.arrays(np.bool_, n))
    few = draw(st.booleans())  # few distinct values: dictionary-heavy
    if pa.types.is_boolean(arrow_type):
        return pa.array(draw(hnp.arrays(np.bool_, n)), arrow_type, mask=mask)
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        text = st.sampled_from(["", "a", "héllo", "x" * 40]) if few else st.text(max_size=12)
        return pa.array(draw(st.lists(text, min_size=n, max_size=n)), arrow_type, mask=mask)
    if pa.types.is_binary(arrow_type):
        blob = st.binary(max_size=3) if few else st.binary(max_size=20)
        return pa.array(draw(st.lists(blob, min_size=n, max_size=n)), arrow_type, mask=mask)
    width = 4 if arrow_type in (pa.int32(), pa.float32(), pa.date32()) else 8
    bits = np.dtype(f"<u{width}")
    elements = st.integers(0, 3) if few else None
    raw = draw(hnp.arrays(bits, n, elements=elements))
    if pa.types.is_floating(arrow_type):  # any bit pattern: NaN payloads, -0.0, inf
        values: np.ndarray = raw.view(f"<f{width}")
    else:
        values = raw.view(f"<i{width}")
        if pa.types.is_timestamp(arrow_type):
            values = values % (1 << 40)  # inside the range every unit can hold
    return pa.array(values, arrow_type, mask=mask)


@st.composite
def tables(draw: Any) -> pa.Table:
    n = draw(st.integers(0, 400))
    count = draw(st.integers(1, 3))
    return pa.table({f"c{i}": draw(columns(n)) for i in range(count)})


def write(table: pa.Table, **options: Any) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out, **options)
    return out.getvalue()


#: PyArrow writer options: every codec, page version, encoding and page size
WRITE_OPTIONS = st.fixed_dictionaries(
    {
        "compression": st.sampled_from(CODECS),
        "data_page_version": st.sampled_from(["1.0", "2.0"]),
        "use_dictionary": st.booleans(),
        "data_page_size": st.sampled_from([64, 1024, 1 << 20]),
        "row_group_size": st.sampled_from([50, 1 << 20]),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=tables(), options=WRITE_OPTIONS)
def test_reference_equals_pyarrow_on_generated_tables(
    table: pa.Table, options: dict[str, Any]
) -> None:
    check_file(write(table, **options))


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("version", ["1.0", "2.0"])
@pytest.mark.parametrize("dictionary", [True, False])
def test_every_codec_page_version_and_encoding(codec: str, version: str, dictionary: bool) -> None:
    rng = np.random.default_rng(7)
    n = 5000
    mask = rng.random(n) < 0.3
    table = pa.table(
        {
            "i": pa.array(rng.integers(0, 50, n), pa.int64(), mask=mask),
            "s": pa.array([f"v{i % 70}" * (i % 3) for i in range(n)], mask=mask),
            "b": pa.array(rng.random(n) < 0.5, mask=mask),
            "f": pa.array(rng.random(n).astype(np.float32)),
            "t": pa.array(rng.integers(0, 10**15, n), pa.timestamp("us")),
        }
    )
    raw = write(
        table,
        compression=codec,
        data_page_version=version,
        use_dictionary=dictionary,
        data_page_size=2000,  # many pages per chunk
    )
    check_file(raw)


def test_dictionary_fallback_to_plain_within_one_chunk() -> None:
    # A dictionary past its limit makes the writer switch to PLAIN pages
    # midway through the chunk: both kinds of page in one chunk.
    strings = [f"value-{i}" for i in range(20000)]
    raw = write(pa.table({"s": strings}), dictionary_pagesize_limit=4096, data_page_size=4096)
    encodings = pq.ParquetFile(io.BytesIO(raw)).metadata.row_group(0).column(0).encodings
    assert "PLAIN" in encodings
    assert "RLE_DICTIONARY" in encodings
    check_file(raw)


_DUCKDB_SELECT = """
SELECT
    CASE WHEN i % 11 = 0 THEN NULL ELSE i::INTEGER END AS a,
    (i * 1000)::BIGINT AS b,
    CASE WHEN i % 3 = 0 THEN NULL ELSE i / 3.0 END::DOUBLE AS c,
    (i % 7)::FLOAT AS f,
    CASE WHEN i % 5 = 0 THEN NULL ELSE i % 2 = 0 END AS bo,
    CASE WHEN i % 5 = 0 THEN NULL ELSE 'x' || (i % 13) END AS s,
    'row ' || i AS u,
    DATE '2020-01-01' + (i % 100)::INTEGER AS d,
    TIMESTAMP '2020-01-01' + to_seconds(i) AS t
FROM range(30000) r(i)
"""


@pytest.mark.parametrize("codec", ["uncompressed", "snappy", "gzip", "zstd", "lz4"])
def test_files_written_by_duckdb(tmp_path: Path, codec: str) -> None:
    duckdb = pytest.importorskip("duckdb")
    path = tmp_path / "duck.parquet"
    with duckdb.connect() as con:
        con.execute(
            f"COPY ({_DUCKDB_SELECT}) TO '{path}' "
            f"(FORMAT parquet, COMPRESSION {codec}, ROW_GROUP_SIZE 10000)"
        )
    check_file(path.read_bytes())


def test_duckdb_v2_files_decode_or_name_the_unsupported_encoding(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    path = tmp_path / "duck2.parquet"
    with duckdb.connect() as con:
        con.execute(f"COPY ({_DUCKDB_SELECT}) TO '{path}' (FORMAT parquet, PARQUET_VERSION V2)")
    reasons = check_file(path.read_bytes(), expect_supported=False)
    assert all(r.startswith("encoding ") for r in reasons.values()), reasons
