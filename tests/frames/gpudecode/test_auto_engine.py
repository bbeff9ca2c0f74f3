"""``engine="auto"`` on a CUDA domain (the emulated device): the kernels take the
columns whose data pages are all dictionary-encoded, the host pool every other
column, and the frame equals PyArrow's read either way."""

from __future__ import annotations

import importlib
import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.frames.gpudecode import _emulator
from tests.frames.gpudecode.test_dictionary import _to_arrow

from nexus_cache.frames.gpudecode.pages import Encoding, PageType, chunk_spec, read_pages

_engine = importlib.import_module("nexus_cache.frames._page_engine")


def _file(**write: object) -> bytes:
    n = 8_000
    rng = np.random.default_rng(7)
    table = pa.table(
        {
            "few": pa.array([f"k{i % 31}" for i in range(n)]),  # dictionary pages
            "ids": pa.array(rng.integers(0, 1 << 60, n), pa.int64()),  # too many: plain
            "small": pa.array(rng.integers(0, 9, n), pa.int32()),  # dictionary
            "plain": pa.array(rng.random(n)),
        }
    )
    out = io.BytesIO()
    pq.write_table(
        table,
        out,
        row_group_size=4_000,
        use_dictionary=["few", "ids", "small"],
        dictionary_pagesize_limit=4096,  # "ids" falls back to PLAIN part way
        data_page_size=8192,
        **write,  # type: ignore[arg-type]
    )
    return out.getvalue()


def _plan(raw: bytes, engine: str) -> tuple[object, dict[str, str], pa.Table]:
    pf = pq.ParquetFile(io.BytesIO(raw))
    schema = pf.schema_arrow
    groups = list(range(pf.metadata.num_row_groups))
    domain = _emulator.Domain()
    plan = _engine.plan_page_columns(engine, domain, pf, raw, groups, schema, "t.parquet")
    columns = _engine.decode_page_columns(plan, schema, domain)
    taken = [f for f in schema if f.name in columns]
    table = pa.Table.from_arrays(
        [_to_arrow(columns[f.name]) for f in taken], schema=pa.schema(taken)
    )
    return plan, plan.paths, table


def _data_page_encodings(raw: bytes, column: str) -> set[str]:
    """The encodings of ``column``'s data pages, from its page headers."""
    pf = pq.ParquetFile(io.BytesIO(raw))
    j = pf.schema_arrow.names.index(column)
    found = set()
    for g in range(pf.metadata.num_row_groups):
        spec = chunk_spec(pf, g, j, "t.parquet")
        for page in read_pages(memoryview(raw)[spec.start : spec.start + spec.size], spec):
            if page.header.type in (PageType.DATA_PAGE, PageType.DATA_PAGE_V2):
                found.add(Encoding(page.header.encoding).name)
    return found


@pytest.mark.usefixtures("emulated_device")
@pytest.mark.parametrize(("version", "page_version"), [("1.0", "2.0"), ("2.6", "1.0")])
def test_auto_takes_the_dictionary_columns_and_leaves_the_rest_to_the_host(
    version: str, page_version: str
) -> None:
    raw = _file(version=version, data_page_version=page_version, compression="snappy")
    # the file is what the test means: "ids" falls back to PLAIN part way
    assert len(_data_page_encodings(raw, "ids")) == 2
    assert "PLAIN" in _data_page_encodings(raw, "ids")
    assert "PLAIN" not in _data_page_encodings(raw, "few") | _data_page_encodings(raw, "small")
    _, paths, table = _plan(raw, "auto")
    assert paths["few"] == paths["small"] == "gpu"
    assert paths["ids"] == paths["plain"] == f"host: {_engine.AUTO_HOST_REASON}"
    assert table.equals(pq.read_table(io.BytesIO(raw), columns=["few", "small"]))
    # the gpu engine takes them all: the rule is auto's, not the decoder's support
    _, gpu_paths, _ = _plan(raw, "gpu")
    assert set(gpu_paths.values()) == {"gpu"}
