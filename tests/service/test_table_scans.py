"""Scans of lakehouse tables through the service: filters, as_of, partitions, pruning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from tests.service._helpers import age_files, make_service, sql_catalog, write_year_month_hive
from tests.tables._compare import assert_same_rows

from nexus_cache.errors import ConfigError
from nexus_cache.service import GraphQuery, Scan, as_query
from nexus_cache.tables import read_table, resolve_table


def test_scan_filter_in_pyarrow_form_round_trips_as_json_lists() -> None:
    scan = Scan("/t", filter=[("year", "=", 2025), ("region", "in", ["eu", "us"])], as_of=2)
    assert scan.filter == ((("year", "=", 2025), ("region", "in", ("eu", "us"))),)
    data = scan.to_dict()
    assert data["filter"] == [[["year", "=", 2025], ["region", "in", ["eu", "us"]]]]
    assert data["as_of"] == 2
    assert as_query(data) == scan
    # an OR of ANDs keeps its clauses
    ors = Scan("/t", filter=[[("a", ">", 1)], [("b", "<", 0.5)]])
    assert ors.filter == ((("a", ">", 1),), (("b", "<", 0.5),))
    assert hash(ors) == hash(as_query(ors.to_dict()))


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"filter": "year=2025"}, "Scan.filter='year=2025'"),
        ({"filter": []}, "Scan.filter=\\[\\]"),
        ({"filter": [("year", "=")]}, "Scan.filter predicate"),
        ({"filter": [("year", "~", 1)]}, "op '~' is not accepted"),
        ({"filter": [("year", "=", {"a": 1})]}, "is not accepted; use a JSON scalar"),
        ({"filter": [("year", "in", [[1]])]}, "a nested list is not accepted"),
        ({"filter": [("year", "=", 1), [("a", "=", 1)]]}, "Scan.filter="),
        ({"as_of": "3"}, "Scan.as_of='3'"),
        ({"as_of": True}, "Scan.as_of=True"),
        ({"as_of": 1.5}, "Scan.as_of=1.5"),
    ],
)
def test_scan_refuses_a_malformed_filter_or_as_of_naming_the_field(kwargs, words) -> None:
    with pytest.raises(ConfigError, match=words):
        Scan("/t", **kwargs)


# -- through QueryService.execute, host backend --------------------------------------


def _edges(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "src": pa.array(rng.integers(0, 40, n), pa.int64()),
            "dst": pa.array(rng.integers(0, 40, n), pa.int64()),
            "w": pa.array(rng.random(n)),
            "kind": pa.array(rng.choice(["follow", "like", "block"], n).tolist(), pa.string()),
        }
    )


@pytest.fixture
def hive(tmp_path: Path) -> Path:
    """edges/year=Y/month=M/part-0.parquet: two int partition levels."""
    root = write_year_month_hive(tmp_path / "edges", lambda n: _edges(200, n), 50)
    (root / "_SUCCESS").write_text("")
    age_files(root)
    return root


def _dataset(root: Path, flt: Any = None, columns: list[str] | None = None) -> pa.Table:
    dataset = ds.dataset(str(root), format="parquet", partitioning="hive")
    expr = None if flt is None else pq.filters_to_expression(flt)
    return dataset.to_table(filter=expr, columns=columns)


@pytest.mark.parametrize(
    ("flt", "columns"),
    [
        (None, None),
        ([("year", "=", 2025)], None),
        ([("year", ">=", 2025), ("month", "in", [1, 3]), ("w", "<", 0.5)], ["src", "year"]),
        ([[("kind", "=", "like"), ("month", "=", 2)], [("src", "<", 3)]], ["src", "dst", "kind"]),
    ],
)
def test_hive_scans_equal_pyarrow_dataset(hive: Path, tmp_path: Path, flt, columns) -> None:
    with make_service(tmp_path) as service:
        result = service.execute(Scan(str(hive), columns=columns, filter=flt))
    want = _dataset(hive, flt, columns)
    assert_same_rows(result.table, want)
    assert "year" in result.table.column_names or columns is not None
    table = result.diagnostics.table
    assert table is not None
    assert table["kind"] == "hive"
    assert table["objects_planned"] == 6
    assert table["rows_before_filter"] == (
        sum(pq.read_metadata(p).num_rows for p in hive.rglob("*.parquet"))
        - table["pruned_by_partition"] * 200
    )
    assert table["rows_after_filter"] == want.num_rows
    assert table["row_groups_pruned"] == 0


def test_a_filter_on_a_partition_prunes_objects_before_they_are_read(
    hive: Path, tmp_path: Path
) -> None:
    with make_service(tmp_path) as service:
        result = service.execute(Scan(str(hive), filter=[("year", "=", 2024), ("month", "=", 2)]))
    table = result.diagnostics.table
    assert table["pruned_by_partition"] == 5
    assert table["objects_read"] == 1
    assert result.diagnostics.lakehouse["objects"] == 1
    assert table["filter"] == [[["month", "=", 2], ["year", "=", 2024]]]  # canonical order


def test_a_filter_that_prunes_everything_is_empty_with_the_right_schema(
    hive: Path, tmp_path: Path
) -> None:
    with make_service(tmp_path) as service:
        pruned = service.execute(Scan(str(hive), ["src", "year"], filter=[("year", "=", 1999)]))
        masked = service.execute(Scan(str(hive), ["src", "kind"], filter=[("w", ">", 2.0)]))
    assert pruned.table.num_rows == 0
    assert pruned.table.schema == pa.schema([("src", pa.int64()), ("year", pa.int32())])
    assert pruned.diagnostics.table["objects_read"] == 0
    # nothing read: the caches' one-word statuses say so (not an empty "mixed()")
    assert pruned.diagnostics.lakehouse["status"] == "none"
    assert pruned.diagnostics.lakehouse["read_mode"] == "none"
    assert pruned.diagnostics.source_cache["status"] == "none"
    assert masked.table.num_rows == 0
    assert masked.table.schema.names == ["src", "kind"]


def test_a_second_filter_over_the_same_columns_is_a_source_cache_hit(
    hive: Path, tmp_path: Path
) -> None:
    with make_service(tmp_path) as service:
        first = service.execute(Scan(str(hive), ["src", "dst"], filter=[("w", "<", 0.3)]))
        second = service.execute(Scan(str(hive), ["src", "dst"], filter=[("w", ">=", 0.6)]))
    assert first.diagnostics.source_cache["status"] == "miss-led"
    assert second.diagnostics.source_cache["status"] == "hit"
    assert second.diagnostics.lakehouse["read"] is False
    assert_same_rows(second.table, _dataset(hive, [("w", ">=", 0.6)], ["src", "dst"]))


def test_filter_errors_name_the_filter_before_any_byte_is_read(hive: Path, tmp_path: Path) -> None:
    with make_service(tmp_path) as service:
        with pytest.raises(ConfigError, match="nope"):
            service.execute(Scan(str(hive), filter=[("nope", "=", 1)]))
        with pytest.raises(ConfigError, match="year"):
            service.execute(Scan(str(hive), filter=[("year", "=", "twenty")]))
        with pytest.raises(ConfigError, match="as_of"):
            service.execute(Scan(str(hive), as_of=1))


def _nx_pagerank(edges: pa.Table) -> dict[int, float]:
    g = nx.MultiDiGraph(list(zip(edges["src"].to_pylist(), edges["dst"].to_pylist(), strict=True)))
    return nx.pagerank(g, alpha=0.85, tol=1e-12, max_iter=1000)


def test_filtered_graph_queries_equal_networkx_and_hit_the_caches(
    hive: Path, tmp_path: Path
) -> None:
    window = [("year", "=", 2025), ("month", "<=", 2)]
    other = [("year", "=", 2025), ("month", "<=", 2), ("kind", "=", "follow")]

    def pagerank(flt: Any) -> GraphQuery:
        scan = Scan(str(hive), columns=["src", "dst", "kind", "year", "month"], filter=flt)
        return GraphQuery(scan, "src", "dst", "pagerank", params={"tol": 1e-10, "max_iter": 1000})

    with make_service(tmp_path) as service:
        first = service.execute(pagerank(window))
        second = service.execute(pagerank(other))
        again = service.execute(pagerank(window))
        bfs = service.execute(
            GraphQuery(
                Scan(str(hive), ["src", "dst"], filter=other),
                "src",
                "dst",
                "bfs",
                params={"source": 0},
            )
        )
    assert first.diagnostics.graph_cache["status"] != "hit"
    assert second.diagnostics.source_cache["status"] == "hit"
    assert second.diagnostics.graph_cache["status"] != "hit"
    assert again.diagnostics.graph_cache["status"] == "hit"
    for result, flt in ((first, window), (second, other), (again, window)):
        want = _nx_pagerank(_dataset(hive, flt, ["src", "dst"]))
        got = dict(
            zip(
                result.table["vertex"].to_pylist(),
                result.table["pagerank"].to_pylist(),
                strict=True,
            )
        )
        assert set(got) == set(want)
        for v, score in want.items():
            assert got[v] == pytest.approx(score, abs=1e-6)
    edges = _dataset(hive, other, ["src", "dst"])
    g = nx.DiGraph()
    g.add_edges_from(zip(edges["src"].to_pylist(), edges["dst"].to_pylist(), strict=True))
    want_levels = nx.single_source_shortest_path_length(g, 0) if 0 in g else {}
    got_levels = dict(
        zip(bfs.table["vertex"].to_pylist(), bfs.table["distance"].to_pylist(), strict=True)
    )
    reached = {v: d for v, d in got_levels.items() if d is not None and d >= 0}
    assert reached == want_levels


def test_a_data_file_linked_out_of_allowed_roots_is_refused(tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    table = tmp_path / "lake" / "t"
    deltalake.write_deltalake(str(table), _edges(50, 1))
    outside = tmp_path / "outside"
    outside.mkdir()
    (data,) = table.glob("*.parquet")
    os.replace(data, outside / "secret.parquet")
    os.symlink(outside / "secret.parquet", data)
    age_files(tmp_path)
    with (
        make_service(tmp_path, allowed_roots=[str(tmp_path / "lake")]) as service,
        pytest.raises(ConfigError, match="outside allowed_roots"),
    ):
        service.execute(Scan(str(table), filter=[("w", "<", 0.5)]))
    with make_service(tmp_path / "open") as service:  # no roots: the link is read
        assert service.execute(Scan(str(table), filter=[("w", "<", 2.0)])).table.num_rows == 50


def test_a_hive_data_file_linked_out_of_allowed_roots_is_refused_not_skipped(
    tmp_path: Path,
) -> None:
    """A symlinked data file of a Hive directory is listed like the plain listing
    lists it: refused when it points out of allowed_roots, read otherwise."""
    root = tmp_path / "lake" / "edges"
    outside = tmp_path / "outside"
    outside.mkdir()
    for year in (2024, 2025):
        (root / f"year={year}").mkdir(parents=True)
        pq.write_table(_edges(30, year), root / f"year={year}" / "part-0.parquet")
    pq.write_table(_edges(20, 9), outside / "secret.parquet")
    os.symlink(outside / "secret.parquet", root / "year=2025" / "part-1.parquet")
    age_files(tmp_path)
    snapshot = resolve_table(str(root))
    assert sum(f.size for f in snapshot.files) == sum(
        os.path.getsize(p) for p in root.rglob("*.parquet")
    )  # the link's size is its target's
    assert len(snapshot.files) == 3
    with (
        make_service(tmp_path, allowed_roots=[str(tmp_path / "lake")]) as service,
        pytest.raises(ConfigError, match="outside allowed_roots"),
    ):
        service.execute(Scan(str(root), filter=[("year", "=", 2025)]))
    with make_service(tmp_path / "open") as service:  # no roots: the link is read
        got = service.execute(Scan(str(root), filter=[("year", "=", 2025)])).table
    assert got.num_rows == 50
    assert_same_rows(got, _dataset(root, [("year", "=", 2025)]))


def test_an_iceberg_manifest_list_outside_allowed_roots_is_refused_unread(
    tmp_path: Path,
) -> None:
    """Metadata under a root that names a manifest list outside it: refused before the
    list is read, as a data file outside is (the data files here all lie under it)."""
    import json

    warehouse = tmp_path / "lake"
    catalog = sql_catalog(warehouse)
    ice = catalog.create_table("ns.e", schema=_edges(1, 0).schema)
    ice.append(_edges(40, 1))
    ice = catalog.load_table("ns.e")
    want = ice.scan().to_arrow()
    metadata_path = Path(ice.metadata_location.removeprefix("file://"))
    metadata = json.loads(metadata_path.read_text())
    (snapshot,) = metadata["snapshots"]
    outside = tmp_path / "outside"
    outside.mkdir()
    moved = outside / "snap-list.avro"
    os.replace(snapshot["manifest-list"].removeprefix("file://"), moved)
    snapshot["manifest-list"] = moved.as_uri()
    metadata_path.write_text(json.dumps(metadata))
    age_files(tmp_path)
    with make_service(tmp_path / "open") as service:  # no roots: the list is read
        assert_same_rows(service.execute(Scan(str(metadata_path))).table, want)
    with (
        make_service(tmp_path, allowed_roots=[str(warehouse)]) as service,
        pytest.raises(ConfigError, match="outside allowed_roots") as raised,
    ):
        service.execute(Scan(str(metadata_path), filter=[("w", "<", 0.5)]))
    assert "snap-list.avro" in str(raised.value)


def test_delta_scans_equal_deltalake_at_every_version(tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    table = tmp_path / "lake" / "d"
    deltalake.write_deltalake(str(table), _edges(60, 1), partition_by=["kind"])
    deltalake.write_deltalake(str(table), _edges(60, 2), mode="append", partition_by=["kind"])
    deltalake.DeltaTable(str(table)).delete("w > 0.7")
    deltalake.write_deltalake(str(table), _edges(30, 3), mode="overwrite", partition_by=["kind"])
    age_files(tmp_path / "lake")
    flt = [("kind", "in", ["follow", "like"]), ("src", "<", 30)]
    with make_service(tmp_path) as service:
        for version in (0, 1, 2, 3, None):
            want = deltalake.DeltaTable(str(table), version=version).to_pyarrow_table()
            got = service.execute(Scan(str(table), as_of=version))
            assert_same_rows(got.table, want.select(got.table.column_names))
            assert got.diagnostics.table["version"] == (3 if version is None else version)
            filtered = service.execute(
                Scan(str(table), ["src", "kind"], filter=flt, as_of=version)
            )
            expr = pq.filters_to_expression(flt)
            assert_same_rows(filtered.table, want.filter(expr).select(["src", "kind"]))


def test_iceberg_scans_equal_pyiceberg_at_every_snapshot(tmp_path: Path) -> None:
    warehouse = tmp_path / "lake"
    catalog = sql_catalog(warehouse)
    ice = catalog.create_table("ns.e", schema=_edges(1, 0).schema)
    ice.append(_edges(40, 1))
    ice.append(_edges(40, 2))
    ice.delete("w >= 0.5")
    from pyiceberg.types import StringType

    with ice.update_schema() as update:  # files written before hold no 'note' column
        update.add_column("note", StringType())
    with ice.update_schema() as update:  # and 'kind' is 'label' from now on (same field id)
        update.rename_column("kind", "label")
    ice = catalog.load_table("ns.e")
    later = _edges(8, 3).rename_columns(["src", "dst", "w", "label"])
    ice.append(later.append_column("note", pa.array(["n"] * 8, pa.large_string())))
    ice = catalog.load_table("ns.e")
    age_files(warehouse)
    location = ice.metadata_location
    flt = [("label", "!=", "block"), ("dst", ">=", 10)]
    with make_service(tmp_path) as service:
        for snap in ice.snapshots():
            want = ice.scan(snapshot_id=snap.snapshot_id).to_arrow()
            got = service.execute(Scan(location, as_of=snap.snapshot_id))
            assert_same_rows(got.table, want)
            assert got.diagnostics.table["version"] == snap.snapshot_id
        # the latest: 'note' is null in the older files, 'label' read from 'kind' there
        assert want.column("note").null_count == want.num_rows - 8
        filtered = service.execute(Scan(location, ["src", "note"], filter=flt))
        expected = want.filter(pq.filters_to_expression(flt)).select(["src", "note"])
        assert_same_rows(filtered.table, expected)
        # the metadata file named alone (no filter, no as_of) is the table too
        assert_same_rows(service.execute(Scan(location)).table, want)
    assert read_table(resolve_table(location), ["src"]).num_rows == want.num_rows


_CATALOG_SCRIPT = """
import sys
from pathlib import Path

import pyarrow.parquet as pq
from tests.service._helpers import make_service

from nexus_cache.errors import ConfigError
from nexus_cache.service import Scan

root, first = Path(sys.argv[1]), int(sys.argv[2])
source = "iceberg://local/ns.e"
with make_service(root / "svc", allowed_roots=[str(root / "lake")]) as service:
    got = service.execute(Scan(source, ["src", "dst"], filter=[("dst", ">=", 10)]))
    pq.write_table(got.table, root / "got.parquet")
    print("version", got.diagnostics.table["version"])
    pq.write_table(service.execute(Scan(source, as_of=first)).table, root / "old.parquet")
with make_service(root / "roots", allowed_roots=[str(root / "elsewhere")]) as service:
    try:
        service.execute(Scan(source))
    except ConfigError as exc:
        print("refused", "outside allowed_roots" in str(exc))
"""


def test_an_iceberg_catalog_table_named_by_url_equals_pyiceberg(tmp_path: Path) -> None:
    """iceberg://<catalog>/<namespace>.<table>, the catalog configured as pyiceberg
    reads it (here PYICEBERG_CATALOG__... variables, read when pyiceberg is first
    imported: so in a fresh process): a SQL catalog on SQLite."""
    pytest.importorskip("pyiceberg")
    pytest.importorskip("sqlalchemy")
    from pyiceberg.catalog import load_catalog

    warehouse = tmp_path / "lake"
    warehouse.mkdir()
    uri = f"sqlite:///{warehouse}/catalog.db"
    catalog = load_catalog("local", type="sql", uri=uri, warehouse=warehouse.as_uri())
    catalog.create_namespace("ns")
    ice = catalog.create_table("ns.e", schema=_edges(1, 0).schema)
    ice.append(_edges(40, 1))
    first = catalog.load_table("ns.e").current_snapshot()
    assert first is not None
    ice.append(_edges(30, 2))
    ice = catalog.load_table("ns.e")
    age_files(warehouse)
    repo = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(repo / "src"), str(repo)]),
        "PYICEBERG_CATALOG__LOCAL__TYPE": "sql",
        "PYICEBERG_CATALOG__LOCAL__URI": uri,
        "PYICEBERG_CATALOG__LOCAL__WAREHOUSE": warehouse.as_uri(),
    }
    done = subprocess.run(
        [sys.executable, "-c", _CATALOG_SCRIPT, str(tmp_path), str(first.snapshot_id)],
        env=env,
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"version {ice.current_snapshot().snapshot_id}" in done.stdout
    assert "refused True" in done.stdout
    flt = pq.filters_to_expression([("dst", ">=", 10)])
    want = ice.scan().to_arrow().filter(flt).select(["src", "dst"])
    assert_same_rows(pq.read_table(tmp_path / "got.parquet"), want)
    old = ice.scan(snapshot_id=first.snapshot_id).to_arrow()
    assert_same_rows(pq.read_table(tmp_path / "old.parquet"), old)
    with pytest.raises(ConfigError, match=r"namespace>\.<table>, e\.g\."):
        resolve_table("iceberg://local/e")


def test_a_count_of_a_delta_table_counts_its_latest_version_only(tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    from nexus_cache.service import Count

    table = tmp_path / "lake" / "d"
    deltalake.write_deltalake(str(table), _edges(60, 1))
    deltalake.write_deltalake(str(table), _edges(25, 2), mode="overwrite")
    age_files(tmp_path / "lake")
    with make_service(tmp_path) as service:
        result = service.execute(Count(str(table)))
    assert result.table["rows"].to_pylist() == [25]  # not the 85 rows of both files


def test_a_filtered_hive_scan_lists_no_pruned_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning enters the kept partitions only: a pruned one is neither listed nor
    stat'ed, and the diagnostics count it (once: it is a partition directory)."""
    root = tmp_path / "days"
    for day in range(10):
        (root / f"day={day}").mkdir(parents=True)
        pq.write_table(pa.table({"v": [day, day + 1]}), root / f"day={day}" / "p.parquet")
    seen: list[str] = []
    real = os.scandir

    def counting(path: Any = ".") -> Any:
        seen.append(os.fspath(path))
        return real(path)

    flt = [("day", "in", [3, 8])]
    with make_service(tmp_path / "svc") as service:
        monkeypatch.setattr(os, "scandir", counting)
        result = service.execute(Scan(str(root), filter=flt))
        monkeypatch.setattr(os, "scandir", real)
    partitions = {Path(p).name for p in seen if Path(p).name.startswith("day=")}
    assert partitions == {"day=0", "day=3", "day=8"}  # day=0: the first object's schema
    assert_same_rows(result.table, _dataset(root, flt, None))
    table = result.diagnostics.table
    assert (table["objects_planned"], table["pruned_by_partition"]) == (10, 8)
