"""Iceberg tables (a SQL catalog on SQLite in a temporary directory) read by
``read_table`` equal pyiceberg's ``scan().to_arrow()`` at every snapshot; schema
evolution reads a later column as null in older files; damaged metadata is a
clear error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nexus_cache.errors import ConfigError, SourceFormatError
from nexus_cache.tables import read_table, read_table_with_plan, resolve_table

from ._compare import assert_same_rows

pytest.importorskip("pyiceberg")
pytest.importorskip("sqlalchemy")


def _batch(start: int, n: int) -> pa.Table:
    return pa.table(
        {
            "k": pa.array([i % 3 for i in range(start, start + n)], pa.int32()),
            "s": pa.array(
                [None if i % 5 == 0 else f"r{i % 4}" for i in range(start, start + n)], pa.string()
            ),
            "v": pa.array([float(i) for i in range(start, start + n)]),
        }
    )


@pytest.fixture(scope="module")
def iceberg(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Any]:
    from pyiceberg.catalog import load_catalog
    from pyiceberg.types import StringType

    warehouse = tmp_path_factory.mktemp("iceberg")
    properties = {
        "type": "sql",
        "uri": f"sqlite:///{warehouse}/catalog.db",
        "warehouse": warehouse.as_uri(),
    }
    catalog = load_catalog("test", **properties)
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", schema=_batch(0, 1).schema)
    with table.update_spec() as spec:
        spec.add_identity("k")
    table.append(_batch(0, 30))
    table.append(_batch(30, 30))
    table.delete("v >= 45")
    table.overwrite(_batch(100, 12))
    table.append(_batch(200, 12))
    with table.update_schema() as update:
        update.add_column("extra", StringType())
    table = catalog.load_table("ns.t")
    later = _batch(300, 6).append_column("extra", pa.array(["e"] * 6, pa.large_string()))
    table.append(later)
    return {"name": "test", **properties}, catalog.load_table("ns.t")


def _want(table: Any, snapshot_id: int | None) -> pa.Table:
    return table.scan(snapshot_id=snapshot_id).to_arrow()


def test_every_snapshot_equals_pyiceberg(iceberg: tuple[dict[str, Any], Any]) -> None:
    properties, table = iceberg
    ids = [s.snapshot_id for s in table.snapshots()]
    assert len(ids) >= 5
    for snapshot_id in [*ids, None]:
        snap = resolve_table("ns.t", as_of=snapshot_id, catalog=properties)
        assert snap.kind == "iceberg"
        assert snap.version == (snapshot_id or table.current_snapshot().snapshot_id)
        assert_same_rows(read_table(snap), _want(table, snapshot_id))


def test_a_column_added_later_reads_as_null_in_older_files(
    iceberg: tuple[dict[str, Any], Any],
) -> None:
    properties, table = iceberg
    snap = resolve_table("ns.t", catalog=properties)
    got = read_table(snap, columns=["v", "extra"])
    extras = got.column("extra").to_pylist()
    assert extras.count("e") == 6
    assert extras.count(None) == got.num_rows - 6 > 0
    assert_same_rows(
        read_table(snap, filter=[("extra", "in", [None])]),
        _want(table, None).filter(pa.compute.is_null(pa.compute.field("extra"))),
    )


@pytest.mark.parametrize(
    "flt",
    [
        [("k", "=", 1)],
        [("s", "not in", ["r1"]), ("v", ">", 100.0)],
        [[("extra", "=", "e")], [("k", "=", 2)]],
        [("k", "=", 9)],
    ],
    ids=str,
)
def test_filters_equal_pyiceberg(iceberg: tuple[dict[str, Any], Any], flt: list) -> None:
    properties, table = iceberg
    snap = resolve_table("ns.t", catalog=properties)
    got, plan = read_table_with_plan(snap, filter=flt)
    assert_same_rows(got, _want(table, None).filter(pq.filters_to_expression(flt)))
    if flt == [("k", "=", 9)]:
        assert plan.pruned_by_partition == plan.objects_planned > 0


def test_the_table_directory_and_metadata_path_read_alike(
    iceberg: tuple[dict[str, Any], Any],
) -> None:
    properties, table = iceberg
    location = table.metadata.location.removeprefix("file://")
    by_dir = resolve_table(location)
    by_file = resolve_table(table.metadata_location.removeprefix("file://"))
    by_catalog = resolve_table("ns.t", catalog=properties)
    assert by_dir.version == by_file.version == by_catalog.version
    assert sorted(by_dir.locations) == sorted(by_catalog.locations)
    assert by_dir.files_outside() == ()
    assert_same_rows(read_table(by_dir), _want(table, None))
    with pytest.raises(ConfigError, match="as_of=12345"):
        resolve_table(location, as_of=12345)


@pytest.mark.parametrize("damage", ["corrupt", "truncated"])
def test_damaged_metadata_is_a_clear_error(
    iceberg: tuple[dict[str, Any], Any], tmp_path: Path, damage: str
) -> None:
    _, table = iceberg
    source = Path(table.metadata_location.removeprefix("file://"))
    copy = tmp_path / "00099-x.metadata.json"
    data = source.read_bytes()
    copy.write_bytes(b"\x00{not json" if damage == "corrupt" else data[: len(data) // 2])
    with pytest.raises(SourceFormatError) as raised:
        resolve_table(str(copy))
    assert str(copy) in str(raised.value)


def test_corrupt_metadata_is_a_one_line_error(tmp_path: Path) -> None:
    """pydantic spreads a validation error over several lines: ours carries one."""
    metadata = tmp_path / "t" / "metadata"
    metadata.mkdir(parents=True)
    (metadata / "v1.metadata.json").write_text("{garbage")
    for source in (tmp_path / "t", metadata / "v1.metadata.json"):
        with pytest.raises(SourceFormatError) as raised:
            resolve_table(str(source))
        assert "\n" not in str(raised.value)
        assert "v1.metadata.json" in str(raised.value)
