"""A filtered table read skips the mask of an object whose frame holds only row groups
that the footer's statistics prove wholly kept, and a filtered count they decide reads
the footers alone; everywhere else the mask runs. Results equal ``pyarrow.dataset``'s,
rows compared without order.

Each data file holds 8 row groups of 100 rows with ``ts`` rising (``day=0``: 0..799,
``day=1``: 1000..1799), so a ``ts`` window on group boundaries is proven by the
statistics."""

from __future__ import annotations

import datetime as dt
import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from tests.frames import _fused_port
from tests.service._helpers import age_files, make_service
from tests.tables._compare import assert_same_rows

from nexus_cache.backends import HostBackend
from nexus_cache.frames import DeviceFrame
from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig
from nexus_cache.service import Count, Scan
from nexus_cache.service._table_filter import count_table, scan_table
from nexus_cache.service._table_scan import (
    choose_row_groups,
    decode_table_object,
    needs_no_mask,
    plan_table,
)

_fused = importlib.import_module("nexus_cache.frames.fused_filter")
_tables = importlib.import_module("nexus_cache.tables")

ROWS, GROUP = 800, 100
WINDOW = [("ts", ">=", 200), ("ts", "<", 400)]  # row groups 2 and 3 of day=0, wholly
#: ``at`` within 200 s .. 400 s (ts 200..399), ``d`` within days 200..399
AT = [("at", ">=", "1970-01-01T00:03:20"), ("at", "<", "1970-01-01T00:06:40")]
DAYS = [("d", ">=", "1970-07-20"), ("d", "<", "1971-02-05")]
#: how pyarrow.dataset reads a filter's time and date values
_PARSE = {"at": dt.datetime.fromisoformat, "d": dt.date.fromisoformat}


def _rows(day: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    ts = np.arange(1000 * day, 1000 * day + ROWS)
    w = ts / 2000.0
    w[250] = np.nan  # in row group 2; Parquet's bounds ignore it
    return pa.table(
        {
            "src": pa.array(rng.integers(0, 30, ROWS), pa.int64()),
            "dst": pa.array(rng.integers(0, 30, ROWS), pa.int64()),
            "ts": pa.array(ts, pa.int64()),
            "at": pa.array(ts * 1000, pa.timestamp("ms")),
            "d": pa.array(ts.astype(np.int32), pa.int32()).cast(pa.date32()),
            "n": pa.array([None if t % 1000 == 350 else int(t) for t in ts], pa.int64()),
            "w": pa.array(w),
        }
    )


def _write(root: Path, **write: Any) -> Path:
    for day in (0, 1):
        part = root / f"day={day}"
        part.mkdir(parents=True)
        pq.write_table(_rows(day, day), part / "part-0.parquet", row_group_size=GROUP, **write)
    age_files(root)
    return root


@pytest.fixture
def hive(tmp_path: Path) -> Path:
    return _write(tmp_path / "edges")


def _reference(flt: Any) -> Any:
    if flt and isinstance(flt[0], list):
        return [_reference(clause) for clause in flt]
    return [(c, op, _PARSE[c](v) if c in _PARSE else v) for c, op, v in flt]


def _dataset(root: Path, flt: Any, columns: list[str]) -> pa.Table:
    dataset = ds.dataset(str(root), format="parquet", partitioning="hive")
    return dataset.to_table(filter=pq.filters_to_expression(_reference(flt)), columns=columns)


class _Masks:
    """Counts the filter masks computed (the real ones, evaluated)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = _tables.filter_mask

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(_tables, "filter_mask", counted)


@pytest.mark.parametrize(
    ("flt", "skipped"),
    [
        ([("day", "=", 0), *WINDOW], [True]),
        (WINDOW, [True, True]),  # day=1: no row group kept, nothing to mask
        (AT, [True, True]),
        (DAYS, [True, True]),
        ([[("day", "=", 0), ("ts", "<", 100)], [("day", "=", 1), ("ts", ">=", 1700)]], [True] * 2),
        ([("ts", ">=", 200), ("ts", "<", 350)], [False, True]),  # group 3 partly: masked
        ([("n", ">=", 300), ("n", "<", 400)], [False, True]),  # a null in group 3
        ([("w", ">=", 0.1), ("w", "<", 0.2)], [False, True]),  # floats: NaN in group 2
        ([[("ts", "<", 100)], [("w", ">", 0.3)]], [False, False]),  # one group of 8 proven
    ],
)
def test_a_scan_skips_the_mask_only_where_the_statistics_prove_every_row(
    hive: Path, tmp_path: Path, flt: Any, skipped: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    masks = _Masks(monkeypatch)
    columns = ["src", "dst", "ts"]  # not w: one of its values is NaN
    with make_service(tmp_path) as service:
        first = service.execute(Scan(str(hive), columns, filter=flt))
        again = service.execute(Scan(str(hive), columns, filter=flt))  # row-group entry hit
    want = _dataset(hive, flt, columns)
    for result in (first, again):
        assert_same_rows(result.table, want)
        table = result.diagnostics.table
        assert [e["mask_skipped"] for e in table["entries"]] == skipped
        assert table["objects_mask_skipped"] == sum(skipped)
        assert table["rows_after_filter"] == want.num_rows
    assert again.diagnostics.source_cache["status"] in ("hit", "none")
    held = sum(1 for e in first.diagnostics.table["entries"] if e["row_groups"] != [])
    assert masks.calls == 2 * sum(
        1
        for e, s in zip(first.diagnostics.table["entries"], skipped, strict=True)
        if not s and e["row_groups"] != []
    )
    assert held >= 1


def test_the_proven_row_groups_are_reported(hive: Path, tmp_path: Path) -> None:
    flt = [("ts", ">=", 200), ("ts", "<", 350)]
    with make_service(tmp_path) as service:
        result = service.execute(Scan(str(hive), ["src"], filter=flt))
    table = result.diagnostics.table
    by_day = {str(e["object"]).split("day=")[1][0]: e for e in table["entries"]}
    assert by_day["0"]["row_groups"] == [2, 3]
    assert by_day["0"]["row_groups_all_true"] == 1  # group 2; group 3 holds 350..399
    assert by_day["1"]["row_groups_all_true"] == 0
    assert table["row_groups_all_true"] == 1


def test_a_whole_object_entry_from_an_unfiltered_scan_is_masked(
    hive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry holds every row group: the rows the statistics pruned are in it."""
    masks = _Masks(monkeypatch)
    flt = WINDOW  # day=0's row groups 2 and 3, every row
    with make_service(tmp_path) as service:
        service.execute(Scan(str(hive), ["src", "dst", "ts"]))  # whole entries
        filtered = service.execute(Scan(str(hive), ["src", "dst"], filter=flt))
    assert filtered.diagnostics.source_cache["status"] == "hit"
    table = filtered.diagnostics.table
    assert [e["row_groups"] for e in table["entries"]] == ["all", "all"]
    assert [e["mask_skipped"] for e in table["entries"]] == [False, False]
    assert table["rows_before_filter"] == 2 * ROWS
    assert masks.calls == 2
    assert_same_rows(filtered.table, _dataset(hive, flt, ["src", "dst"]))


def test_files_without_statistics_are_masked(tmp_path: Path) -> None:
    root = _write(tmp_path / "plain", write_statistics=False)
    with make_service(tmp_path) as service:
        result = service.execute(Scan(str(root), ["src", "ts"], filter=WINDOW))
    table = result.diagnostics.table
    assert [e["mask_skipped"] for e in table["entries"]] == [False, False]
    assert table["row_groups_all_true"] == 0
    assert_same_rows(result.table, _dataset(root, WINDOW, ["src", "ts"]))


@pytest.mark.parametrize(
    ("flt", "footers"),
    [
        (WINDOW, True),
        ([[("day", "=", 0), ("ts", "<", 100)], [("day", "=", 1), ("ts", ">=", 1700)]], True),
        (DAYS, True),
        (AT, True),
        ([("ts", ">=", 200), ("ts", "<", 350)], False),  # group 3 partly
        ([("w", ">=", 0.1), ("w", "<", 0.2)], False),  # floats
        ([("n", ">=", 300), ("n", "<", 400)], False),  # nulls
    ],
)
def test_a_count_the_statistics_decide_reads_the_footers_alone(
    hive: Path, tmp_path: Path, flt: Any, footers: bool
) -> None:
    with make_service(tmp_path) as service:
        results = [service.execute(Count(str(hive), filter=flt)) for _ in range(2)]
        cache = service.caches.source_cache(0)
        assert cache is not None
        entries = cache.stats().entries
    # count_rows would trust the float statistics and count the NaN row
    want = _dataset(hive, flt, ["ts"]).num_rows
    for result in results:
        assert result.table["rows"].to_pylist() == [want]
        status = result.diagnostics.source_cache
        if footers:  # nothing decoded, nothing cached
            assert status == {"status": "bypass", "reason": "synthetic count source"}
            assert result.diagnostics.table["rows_after_filter"] == want
            assert all(e["mask_skipped"] for e in result.diagnostics.table["entries"])
        else:
            assert status["status"] in ("miss-led", "hit")
    assert (entries == 0) is footers


@pytest.mark.parametrize("flt", [WINDOW, [("ts", ">=", 200), ("ts", "<", 350)]])
def test_the_emulated_device_scan_and_count_skip_a_proven_objects_filter(
    hive: Path, tmp_path: Path, flt: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fused filter gets no filter (every row kept) for a proven object's frame,
    the same result as the host's and pyarrow.dataset's."""
    host = HostBackend(device_total_bytes=1 << 28).create_domain(0)
    config = LakehouseCacheConfig(root=tmp_path / "cache", local_min_age_s=0.0)
    columns = ["src", "ts"]
    with LakehouseCache(config) as cache:
        plan = plan_table(cache, Scan(str(hive), columns, filter=flt))
        read = plan.table
        assert read is not None
        frames: list[DeviceFrame] = []
        unmasked = []
        for p, f in zip(plan.plans, read.files, strict=True):
            choice = choose_row_groups(cache, p, f, read, [])
            frames.append(
                decode_table_object(
                    cache,
                    p,
                    f,
                    read,
                    host,
                    [],
                    row_groups=choice.groups,
                    opened=choice.opened,
                    footer=choice.footer,
                )
            )
            unmasked.append(needs_no_mask(choice.groups, choice))
    assert unmasked == ([True, True] if flt == WINDOW else [False, True])
    want = _dataset(hive, flt, columns)
    built = scan_table(frames, read, host, unmasked=unmasked)
    assert built is not None
    assert_same_rows(built[0], want)
    programs: list[Any] = []
    real = _fused.filter_program

    def counted(*args: Any) -> Any:
        programs.append(args)
        return real(*args)

    monkeypatch.setattr(_fused, "filter_program", counted)
    kernels = _fused_port.PortKernels()
    monkeypatch.setattr(_fused, "_CUDA", kernels)
    domain = _fused_port.Domain()
    got = scan_table(frames, read, domain, unmasked=unmasked)
    assert got is not None
    assert isinstance(got[0], pa.Table)
    assert got[0].equals(built[0])
    assert got[1] == built[1]
    assert count_table(frames, read, domain, unmasked) == built[1]
    assert built[1].rows_after == want.num_rows
    # one program per masked frame with rows, for the scan and the count
    assert len(programs) == 2 * sum(
        1 for skip, frame in zip(unmasked, frames, strict=True) if not skip and frame.num_rows
    )
    assert kernels.launches["fused_filter_count"] == 2
    for frame in frames:
        frame.release()


def test_an_unmasked_frame_keeps_every_row_it_holds(hive: Path, tmp_path: Path) -> None:
    """``unmasked`` is obeyed, not checked again: a frame said to need no mask keeps
    rows the filter would drop (why :func:`needs_no_mask` decides it alone)."""
    host = HostBackend(device_total_bytes=1 << 28).create_domain(0)
    config = LakehouseCacheConfig(root=tmp_path / "cache", local_min_age_s=0.0)
    flt = [("day", "=", 0), *WINDOW]
    with LakehouseCache(config) as cache:
        plan = plan_table(cache, Scan(str(hive), ["ts"], filter=flt))
        read = plan.table
        assert read is not None
        frames = [
            decode_table_object(cache, p, f, read, host, [])  # the whole object
            for p, f in zip(plan.plans, read.files, strict=True)
        ]
    masked = scan_table(frames, read, host)
    unmasked = scan_table(frames, read, host, unmasked=[True])
    assert masked is not None
    assert unmasked is not None
    assert masked[0].num_rows == 200
    assert unmasked[0].num_rows == ROWS
    assert count_table(frames, read, host, [True]).rows_after == ROWS
    for frame in frames:
        frame.release()
