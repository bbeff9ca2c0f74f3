"""A time written finer than a timestamp column's unit filters as pyarrow compares it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tests.service._helpers import age_files, make_service

from nexus_cache.service import Count, Scan
from nexus_cache.tables import read_table, resolve_table

_SECOND = 1_735_689_600  # 2025-01-01T00:00:00Z
_PER_SECOND = {"ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_OPS = ["=", "!=", "<", "<=", ">", ">=", "in", "not in"]


def _reference(table: pa.Table, op: str, nanos: int) -> list[int]:
    """The rows pyarrow keeps: the column and the time compared in nanoseconds."""
    column = pc.field("ts").cast(pa.timestamp("ns", "UTC"))
    value = pa.scalar(nanos, pa.timestamp("ns", "UTC"))
    expression = {
        "=": column == value,
        "!=": column != value,
        "<": column < value,
        "<=": column <= value,
        ">": column > value,
        ">=": column >= value,
        "in": column.isin(pa.array([value])),
        "not in": ~column.isin(pa.array([value])),
    }[op]
    return sorted(table.filter(expression)["i"].to_pylist())


@pytest.mark.parametrize(
    ("unit", "text", "nanos"),
    [
        # nine digits on a nanosecond column: Python's datetime keeps six of them
        ("ns", "2025-01-01T00:00:00.123456789Z", 123_456_789),
        ("ns", "2025-01-01T01:00:00.000000001+01:00", 1),
        # finer than the column's unit: between two of its values
        ("us", "2025-01-01T00:00:00.0000005", 500),
        ("ms", "2025-01-01 00:00:00,0005", 500_000),
    ],
)
def test_a_time_finer_than_microseconds_keeps_the_rows_pyarrow_keeps(
    tmp_path: Path, unit: str, text: str, nanos: int
) -> None:
    per = _PER_SECOND[unit]
    tick = 1_000_000_000 // per
    start = _SECOND * per
    near = nanos // tick  # the column's value at or just below the time
    values = [start + near - 1, start + near, start + near + 1, None, start]
    table = pa.table(
        {"ts": pa.array(values, pa.timestamp(unit, "UTC")), "i": list(range(len(values)))}
    )
    path = tmp_path / "lake" / "t.parquet"
    path.parent.mkdir()
    pq.write_table(table, path)
    age_files(tmp_path / "lake")
    with make_service(tmp_path / "svc") as service:
        for op in _OPS:
            flt = [("ts", op, [text] if op.endswith("in") else text)]
            want = _reference(table, op, _SECOND * 1_000_000_000 + nanos)
            got = service.execute(Scan(str(path), ["i"], filter=flt)).table
            assert sorted(got["i"].to_pylist()) == want, (op, text)
            counted = service.execute(Count(str(path), filter=flt)).table
            assert counted["rows"].to_pylist() == [len(want)], (op, text)
            host = read_table(resolve_table(str(path)), ["i"], flt)
            assert sorted(host["i"].to_pylist()) == want, (op, text)
