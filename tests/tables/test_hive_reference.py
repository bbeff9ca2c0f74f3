"""Parquet objects and Hive directories read by ``read_table`` equal ``pyarrow.dataset``
(``partitioning="hive"``, ``filter=``), every filter op included; the mask runs on
the array module a GPU would use (NumPy here)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from nexus_cache.errors import ConfigError
from nexus_cache.tables import (
    canonical_filter,
    filter_mask,
    host_columns,
    read_table,
    read_table_with_plan,
    resolve_table,
)

from ._compare import assert_same_rows

T0 = dt.datetime(2025, 1, 1)


def _rows(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    words = np.array(["apple", "b", "banana", "", "cherry", "é-accent", "apples"], dtype=object)
    s = [None if i % 7 == 3 else str(w) for i, w in enumerate(rng.choice(words, n))]
    f = rng.normal(size=n)
    return pa.table(
        {
            "i": pa.array(
                [None if k % 11 == 5 else int(v) for k, v in enumerate(rng.integers(-50, 50, n))],
                pa.int64(),
            ),
            "f": pa.array([None if k % 13 == 1 else float(v) for k, v in enumerate(f)]),
            "s": pa.array(s, pa.string()),
            "b": pa.array([None if k % 9 == 2 else bool(k % 3) for k in range(n)]),
            "t": pa.array(
                [T0 + dt.timedelta(hours=int(h)) for h in rng.integers(0, 24 * 60, n)],
                pa.timestamp("us"),
            ),
        }
    )


@pytest.fixture(scope="module")
def hive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two levels, an int and a string key, a null partition, hidden files, several row groups."""
    root = tmp_path_factory.mktemp("hive")
    seed = 0
    for year in (2023, 2024, 2025):
        for region in ("eu", "us", "__HIVE_DEFAULT_PARTITION__"):
            part = root / f"year={year}" / f"region={region}"
            part.mkdir(parents=True)
            seed += 1
            pq.write_table(_rows(300, seed), part / "part-0.parquet", row_group_size=64)
    (root / "_SUCCESS").write_text("")
    (root / "_temporary").mkdir()
    pq.write_table(_rows(5, 99), root / "_temporary" / "junk.parquet")
    pq.write_table(_rows(5, 98), root / "year=2025" / ".hidden.parquet")
    return root


def _reference(root: Path, flt: object = None, columns: list[str] | None = None) -> pa.Table:
    dataset = ds.dataset(
        str(root),
        format="parquet",
        partitioning="hive",
        exclude_invalid_files=False,
        ignore_prefixes=[".", "_"],
    )
    expression = None if flt is None else pq.filters_to_expression(_as_python(flt))
    return dataset.to_table(columns=columns, filter=expression)


def _as_python(flt: Any) -> Any:
    """The filter with timestamps as datetimes (pyarrow compares no text with them)."""
    if isinstance(flt, list) and flt and isinstance(flt[0], list):
        return [_as_python(clause) for clause in flt]
    out = []
    for column, op, value in flt:
        if column == "t" and isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        elif column == "t" and isinstance(value, int):
            value = dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=value)
        out.append((column, op, value))
    return out


def test_the_snapshot_lists_partitions_typed_as_pyarrow_infers_them(hive: Path) -> None:
    snap = resolve_table(str(hive))
    assert snap.kind == "hive"
    assert snap.version is None
    assert snap.partition_schema == pa.schema([("year", pa.int32()), ("region", pa.string())])
    assert len(snap.files) == 9
    assert all(
        not Path(f.path).name.startswith(".") and "_temporary" not in f.path for f in snap.files
    )
    assert {f.path: f.size for f in snap.files} == {
        f.path: os.path.getsize(f.path) for f in snap.files
    }
    nulls = [f for f in snap.files if f.partition_values["region"] is None]
    assert len(nulls) == 3
    assert snap.files_outside() == ()
    assert _reference(hive).schema.field("year").type == pa.int32()


FILTERS = [
    None,
    [("year", "=", 2024)],
    [("year", ">=", 2024), ("region", "=", "eu")],
    [("region", "in", ["us", None])],
    [("region", "not in", ["us"])],
    [("year", "!=", 2024), ("i", ">", 10)],
    [[("year", "<", 2024), ("s", "=", "apple")], [("region", "=", "eu"), ("f", "<=", -0.5)]],
    [("s", ">", "apple")],
    [("s", "<", "b")],
    [("s", "<=", "apples")],
    [("s", ">=", "")],
    [("s", "in", ["", "banana", "é-accent", None])],
    [("s", "not in", ["banana", "cherry"])],
    [("s", "!=", "b")],
    [("f", ">", 0.25), ("b", "=", True)],
    [("b", "!=", True)],
    [("b", "in", [False, None])],
    [("i", "in", [-3, 0, 7, 49])],
    [("i", "not in", [-3, 0, 7, None])],
    [("i", "<", -20.5)],
    [("t", ">=", "2025-02-01T00:00:00"), ("t", "<", "2025-02-03")],
    [("t", "<", int((dt.datetime(2025, 1, 3) - dt.datetime(1970, 1, 1)).total_seconds() * 1e6))],
    [("year", "=", 2030)],  # prunes everything
    [("region", "=", "asia"), ("i", ">", 0)],
]


@pytest.mark.parametrize("flt", FILTERS, ids=lambda f: str(f)[:60])
def test_read_table_equals_pyarrow_dataset(hive: Path, flt: object) -> None:
    snap = resolve_table(str(hive))
    assert_same_rows(read_table(snap, filter=flt), _reference(hive, flt))


def test_a_projection_needs_no_filter_column(hive: Path) -> None:
    snap = resolve_table(str(hive))
    flt = [("region", "=", "eu"), ("i", ">", 0)]
    got = read_table(snap, columns=["s", "year"], filter=flt)
    assert got.column_names == ["s", "year"]
    assert_same_rows(got, _reference(hive, flt, columns=["s", "year"]))


def test_pruning_counts_partitions_and_row_groups(hive: Path) -> None:
    snap = resolve_table(str(hive))
    _, plan = read_table_with_plan(snap, filter=[("year", "=", 2024), ("region", "=", "eu")])
    assert plan.objects_planned == 9
    assert plan.pruned_by_partition == 8
    assert len(plan.files) == 1
    # sorted data makes row-group statistics selective
    sorted_root = hive.parent / "sorted"
    sorted_root.mkdir(exist_ok=True)
    table = pa.table({"k": pa.array(range(1000), pa.int64()), "v": pa.array(range(1000))})
    pq.write_table(table, sorted_root / "a.parquet", row_group_size=100)
    flat = resolve_table(str(sorted_root))
    assert flat.kind == "parquet"
    assert flat.partition_schema.names == []
    got, plan = read_table_with_plan(flat, filter=[("k", ">=", 250), ("k", "<", 420)])
    assert got.num_rows == 170
    assert plan.row_groups_total == 10
    assert plan.row_groups_pruned == 7
    nothing, plan = read_table_with_plan(flat, filter=[("k", ">", 5000)])
    assert nothing.num_rows == 0
    assert nothing.schema == flat.schema
    assert plan.row_groups_pruned == 10
    assert plan.files == ()


def test_a_filter_that_prunes_everything_has_the_schema(hive: Path) -> None:
    snap = resolve_table(str(hive))
    got, plan = read_table_with_plan(snap, columns=["i", "region"], filter=[("year", "=", 1999)])
    assert got.num_rows == 0
    assert got.schema == pa.schema([("i", pa.int64()), ("region", pa.string())])
    assert plan.pruned_by_partition == 9


def test_a_bad_filter_is_refused_before_any_byte_is_read(hive: Path, tmp_path: Path) -> None:
    snap = resolve_table(str(hive))
    # the files vanish: a filter error must come first, a read would fail differently
    gone = snap.__class__(
        **{
            **snap.__dict__,
            "files": tuple(f.__class__(str(tmp_path / "x.parquet"), 1) for f in snap.files),
        }
    )
    with pytest.raises(ConfigError, match="no column 'nope'"):
        read_table(gone, filter=[("nope", "=", 1)])
    with pytest.raises(FileNotFoundError):
        read_table(gone, filter=[("i", "=", 1)])


def test_the_mask_runs_on_the_array_module(hive: Path) -> None:
    # the code path a GPU runs (CuPy there): columns as arrays of xp, a mask of xp
    table = _reference(hive)
    flt = canonical_filter(
        [
            [("s", "in", ["apple", "b"]), ("f", ">", 0.0)],
            [("t", "<", "2025-01-02"), ("b", "=", False)],
        ],
        table.schema,
    )
    assert flt is not None
    columns = host_columns(table, flt.columns, xp=np)
    assert all(isinstance(c.data, np.ndarray) for c in columns.values())
    mask = filter_mask(flt, columns, table.num_rows, np)
    assert isinstance(mask, np.ndarray)
    assert mask.dtype == bool
    assert_same_rows(table.filter(pa.array(mask)), table.filter(flt.to_expression()))
    # a dictionary-encoded string column evaluates on its dictionary
    encoded = table.set_column(
        table.schema.get_field_index("s"), "s", table.column("s").dictionary_encode()
    )
    enc_columns = host_columns(encoded, flt.columns, xp=np)
    assert np.array_equal(filter_mask(flt, enc_columns, table.num_rows, np), mask)


def test_a_huge_in_list_of_strings_and_ints_matches_pyarrow(tmp_path: Path) -> None:
    n = 20_000
    table = pa.table(
        {"k": pa.array(range(n), pa.int64()), "s": pa.array([f"key-{i}" for i in range(n)])}
    )
    pq.write_table(table, tmp_path / "a.parquet")
    snap = resolve_table(str(tmp_path / "a.parquet"))
    wanted = [f"key-{i}" for i in range(0, 2 * n, 3)]
    flt = [("s", "in", wanted), ("k", "not in", list(range(0, n, 2)))]
    assert_same_rows(read_table(snap, filter=flt), table.filter(pq.filters_to_expression(flt)))


def test_a_local_directory_lists_what_the_fsspec_listing_of_its_url_lists(
    tmp_path: Path,
) -> None:
    """The local listing (``os.walk``) and fsspec's (a ``file://`` URL) agree: a link
    to a file is listed with its target's size, a link to a directory is not
    followed, a dangling link, a FIFO, hidden and ``_`` directories are skipped."""
    root = tmp_path / "t"
    for part in ("k=1", "k=2/j=a", ".hidden", "_temporary"):
        (root / part).mkdir(parents=True)
        pq.write_table(_rows(5, len(part)), root / part / "p.parquet")
    outside = tmp_path / "outside"
    outside.mkdir()
    pq.write_table(_rows(9, 1), outside / "x.parquet")
    os.symlink(outside / "x.parquet", root / "k=1" / "linked.parquet")
    os.symlink(outside, root / "k=3")  # a directory link: not descended
    os.symlink(tmp_path / "gone.parquet", root / "k=1" / "dangling.parquet")
    os.mkfifo(root / "k=2" / "fifo.parquet")
    local = resolve_table(str(root))
    url = resolve_table(root.as_uri())
    got = [(f.path, f.size, f.partition) for f in local.files]
    want = [(f.path.removeprefix("file://"), f.size, f.partition) for f in url.files]
    assert got == want
    assert [Path(p).name for p, _, _ in got] == ["linked.parquet", "p.parquet", "p.parquet"]
    assert got[0][1] == (outside / "x.parquet").stat().st_size


@pytest.mark.parametrize(
    "names",
    [
        ["+2", "1"],  # Arrow reads no '+': a string column
        ["0x1f", "2"],  # hex: int32
        ["0xFFFFFFFF", "0x80000000"],  # a 32-bit pattern: -1 and -2**31
        ["0x0000000001", "1"],  # more than 8 hex digits: a string column
        ["-0x1", "1"],
        ["-00012", "2147483647", "-2147483648"],
        ["2147483648", "1"],
    ],
    ids=lambda names: ",".join(names),
)
@pytest.mark.parametrize("pruned", [False, True], ids=["full", "pruned"])
def test_partition_values_are_typed_as_pyarrow_dataset_types_them(
    tmp_path: Path, names: list[str], pruned: bool
) -> None:
    for i, name in enumerate(names):
        (tmp_path / f"k={name}").mkdir()
        pq.write_table(pa.table({"x": [i]}), tmp_path / f"k={name}" / "p.parquet")
    want = ds.dataset(tmp_path, format="parquet", partitioning="hive").to_table()
    kept = [("x", ">=", 0)]  # a filter on a data column: every partition is kept
    snap = resolve_table(str(tmp_path), filter=[("k", "in", [None])] if pruned else None)
    assert snap.partition_schema.field("k").type == want.schema.field("k").type
    assert_same_rows(read_table(resolve_table(str(tmp_path), filter=kept), filter=kept), want)
    assert_same_rows(read_table(resolve_table(str(tmp_path))), want)
