"""Bad input through the service and its commands: refused with one line and exit 2.

A string column's raw bytes must never pass as vertex ids or weights, a file
that is not Parquet is named, and every input error of ``scan``/``graph``
exits 2 (the command line must change), not 1.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nexus_cache.cli.main import main
from nexus_cache.errors import ConfigError, GraphInputError, SourceFormatError
from nexus_cache.service import Count, GraphQuery, Scan, ServiceConfig, as_query

from ._helpers import make_service, use_host_cli


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    use_host_cli(monkeypatch)
    return tmp_path


@pytest.fixture
def edges(tmp_path: Path) -> Path:
    path = tmp_path / "edges.parquet"
    table = pa.table(
        {
            "s": [0, 1, 2, 2],
            "d": [1, 2, 0, 3],
            "name": ["a", "b", "c", "d"],
            "f": [0.5, 1.5, 2.5, 3.5],
            "flag": [True, False, True, True],
        }
    )
    pq.write_table(table, path)
    return path


@pytest.mark.parametrize("column", ["name", "flag", "f"])
def test_non_integer_vertex_columns_are_refused(tmp_path: Path, edges: Path, column: str) -> None:
    with make_service(tmp_path) as service:
        with pytest.raises(GraphInputError, match=f"column '{column}'.*integer"):
            service.execute(GraphQuery(Scan(str(edges)), column, "d", "bfs", params={"source": 0}))
        with pytest.raises(GraphInputError, match=f"column '{column}'.*integer"):
            service.execute(GraphQuery(Scan(str(edges)), "s", column, "pagerank"))


@pytest.mark.parametrize("column", ["name", "flag"])
def test_non_numeric_weight_is_refused(tmp_path: Path, edges: Path, column: str) -> None:
    with (
        make_service(tmp_path) as service,
        pytest.raises(GraphInputError, match=f"weight column '{column}'"),
    ):
        service.execute(GraphQuery(Scan(str(edges)), "s", "d", "pagerank", weight=column))


def test_not_parquet_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet at all")
    with make_service(tmp_path) as service:
        for query in (Scan(str(bad)), Count(str(bad))):
            with pytest.raises(SourceFormatError, match=r"bad\.parquet.*is not readable Parquet"):
                service.execute(query)


def test_input_errors_exit_2_with_one_line(
    env: Path, edges: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = env / "bad.parquet"
    bad.write_text("not parquet")
    cases = [
        (["scan", str(env / "missing.parquet")], "does not exist"),
        (["scan", str(bad)], "is not readable Parquet"),
        (["graph", "bfs", str(edges), "--src", "s", "--dst", "d", "--source", "99"], "[99]"),
        (["graph", "bfs", str(edges), "--src", "name", "--dst", "d", "--source", "0"], "string"),
        (["graph", "pagerank", str(edges), "--src", "f", "--dst", "d"], "double"),
        (
            ["graph", "pagerank", str(edges), "--src", "s", "--dst", "d", "--weight", "name"],
            "weight",
        ),
    ]
    for argv, expected in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.count("\n") == 1, captured.err
        assert expected in captured.err
        assert "Traceback" not in captured.err


def test_config_file_that_is_a_directory_or_binary(tmp_path: Path, edges: Path) -> None:
    with pytest.raises(ConfigError, match=r"path=.*cannot be read"):
        ServiceConfig.load(tmp_path, environ={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        ServiceConfig.load(edges, environ={})


def test_evidence_dir_of_the_wrong_type_is_a_config_error(tmp_path: Path) -> None:
    toml = tmp_path / "service.toml"
    toml.write_text("evidence_dir = 5\n")
    with pytest.raises(ConfigError, match="evidence_dir=5"):
        ServiceConfig.load(toml, environ={})


def test_unusable_evidence_dir_names_the_variable(
    env: Path, edges: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NEXUS_SERVICE_EVIDENCE_DIR", str(edges))  # a file, not a directory
    assert main(["scan", str(edges)]) == 2
    err = capsys.readouterr().err
    assert "NEXUS_SERVICE_EVIDENCE_DIR" in err
    assert err.count("\n") == 1


def test_json_columns_must_be_a_list() -> None:
    from nexus_cache.service import as_query

    # a string is iterable: "sd" must not become the columns ('s', 'd')
    for columns in ("sd", "s", 5, {"s": 1}):
        with pytest.raises(ConfigError, match=r"Scan\.columns"):
            as_query({"type": "scan", "source": "x.parquet", "columns": columns})
    query = as_query({"type": "scan", "source": "x.parquet", "columns": ["s", "d"]})
    assert query == Scan("x.parquet", columns=("s", "d"))


def test_graph_edges_must_read_its_columns() -> None:
    with pytest.raises(ConfigError, match=r"leaves out \['d'\]"):
        GraphQuery(Scan("x.parquet", columns=("s",)), "s", "d", "pagerank")
    with pytest.raises(ConfigError, match=r"leaves out \['w'\]"):
        GraphQuery(Scan("x.parquet", columns=("s", "d")), "s", "d", "pagerank", weight="w")
    GraphQuery(Scan("x.parquet", columns=("s", "d", "w")), "s", "d", "pagerank", weight="w")


def test_bfs_source_outside_int64_is_a_config_error() -> None:
    for source in (2**63, -(2**63) - 1, 10**30):
        with pytest.raises(ConfigError, match=r"params\['source'\]"):
            GraphQuery(Scan("x.parquet"), "s", "d", "bfs", params={"source": source})
    GraphQuery(Scan("x.parquet"), "s", "d", "bfs", params={"source": 2**63 - 1})


def test_execute_refuses_what_is_not_a_query(tmp_path: Path, edges: Path) -> None:
    with make_service(tmp_path) as service:
        for bad in (None, 5, [1, 2], Scan):
            with pytest.raises(ConfigError, match="use a Scan, Count or GraphQuery"):
                service.execute(bad)  # type: ignore[arg-type]
        assert service.execute(Count(str(edges))).table.column("rows").to_pylist() == [4]


def test_demo_workdir_that_cannot_be_a_directory_exits_2(
    edges: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--scale", "4", "--backend", "host", "--workdir", str(edges)]) == 2
    err = capsys.readouterr().err
    assert "workdir=" in err
    assert err.count("\n") == 1


def test_demo_empty_workdir_exits_2_and_leaves_the_working_directory_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # --workdir '' filled the working directory with lake/, cache/ and evidence/
    monkeypatch.chdir(tmp_path)
    for empty in ("", "  "):
        assert main(["demo", "--scale", "3", "--backend", "host", "--workdir", empty]) == 2
        err = capsys.readouterr().err
        assert "workdir=" in err
        assert "is empty" in err
    assert list(tmp_path.iterdir()) == []


def test_negative_limit_is_a_usage_error(
    env: Path, edges: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["scan", str(edges), "--limit", "-1"])
    assert exit_.value.code == 2
    assert "--limit" in capsys.readouterr().err
    assert main(["scan", str(edges), "--limit", "0"]) == 0
    assert capsys.readouterr().out.startswith("4 rows")


def _objects(root: Path, *tables: pa.Table) -> str:
    root.mkdir()
    for i, table in enumerate(tables):
        pq.write_table(table, root / f"part-{i}.parquet")
    return str(root)


def test_a_directory_whose_objects_drifted_is_combined(tmp_path: Path) -> None:
    widened = _objects(
        tmp_path / "widened",
        pa.table({"s": pa.array([0, 1], pa.int32()), "d": pa.array([1, 2], pa.int32())}),
        pa.table({"s": pa.array([2], pa.int64()), "d": pa.array([0], pa.int64())}),
    )
    added = _objects(
        tmp_path / "added",
        pa.table({"s": [0, 1], "d": [1, 2]}),
        pa.table({"s": [2], "d": [0], "w": [0.5]}),
    )
    with make_service(tmp_path) as service:
        table = service.execute(Scan(widened)).table
        assert table.schema.field("s").type == pa.int64()
        assert table.column("s").to_pylist() == [0, 1, 2]
        table = service.execute(Scan(added)).table
        assert table.column("w").to_pylist() == [None, None, 0.5]
        ranks = service.execute(GraphQuery(Scan(widened), "s", "d", "pagerank")).table
        assert ranks.num_rows == 3


def test_a_drifted_directory_with_named_columns_is_null_where_an_object_lacks_one(
    tmp_path: Path,
) -> None:
    """Named columns read as the whole scan reads them: an object that lacks one is
    null there (in the host and the device result, in the order asked); a column
    no object holds is refused; a graph's object without its edge columns is named."""
    source = _objects(
        tmp_path / "added",
        pa.table({"s": [0, 1], "d": [1, 2], "w": [0.5, 1.5]}),
        pa.table({"s": [2], "d": [0]}),  # written before w was added
        pa.table({"x": [7, 8]}),  # holds none of the columns asked for
    )
    whole = pa.concat_tables(
        [pq.read_table(p) for p in sorted(Path(source).glob("*.parquet"))],
        promote_options="permissive",
    )
    with make_service(tmp_path) as service:
        for columns in (["w", "s"], ["s", "w"], ["w"]):
            got = service.execute(Scan(source, columns)).table
            assert got.equals(whole.select(columns)), columns
            held = service.execute_on_device(Scan(source, columns))
            try:
                assert held.to_arrow().equals(whole.select(columns)), columns
            finally:
                held.release()
        with pytest.raises(ConfigError, match=r"columns \['nope'\] are in none of"):
            service.execute(Scan(source, ["s", "nope"]))
        with pytest.raises(GraphInputError, match=r"part-2\.parquet.* has no column 's'"):
            service.execute(GraphQuery(Scan(source), "s", "d", "pagerank", weight="w"))


def test_objects_whose_types_cannot_be_combined(tmp_path: Path) -> None:
    source = _objects(
        tmp_path / "clash",
        pa.table({"s": [0, 1], "d": [1, 2]}),
        pa.table({"s": ["x"], "d": [0]}),  # the second object's ids are strings
    )
    with make_service(tmp_path) as service:
        with pytest.raises(SourceFormatError, match="cannot be combined"):
            service.execute(Scan(source))
        with pytest.raises(GraphInputError, match="column 's' has Arrow type string"):
            service.execute(GraphQuery(Scan(source), "s", "d", "pagerank"))


def test_shutdown_timeout_is_checked_first(tmp_path: Path, edges: Path) -> None:
    service = make_service(tmp_path)
    for bad in (-1, float("nan"), float("inf"), "10", None, True):
        with pytest.raises(ConfigError, match="shutdown timeout"):
            service.shutdown(bad)  # type: ignore[arg-type]
        assert not service.closed
    assert service.execute(Count(str(edges))).table.num_rows == 1
    first = service.shutdown(0)
    assert service.shutdown() == first


def test_shutdown_with_a_huge_timeout_waits_for_a_held_result(tmp_path: Path, edges: Path) -> None:
    # a finite timeout beyond threading.TIMEOUT_MAX raised OverflowError while it
    # waited for the result, leaving the service closed and its caches up
    service = make_service(tmp_path)
    result = service.execute_on_device(Scan(str(edges)))
    timer = threading.Timer(0.05, result.release)
    timer.start()
    try:
        shutdown = service.shutdown(timeout=1e30)
    finally:
        timer.join()
    assert all(d.complete for d in shutdown)
    assert service.shutdown() == shutdown


def test_a_corrupt_column_chunk_is_a_source_format_error_naming_the_object(
    tmp_path: Path,
    edges: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Arrow's "Corrupt snappy compressed data." / "Unexpected end of stream" (an
    # OSError) reached the caller bare: no object named, exit status 1
    broken = tmp_path / "broken.parquet"
    pq.write_table(pq.read_table(edges), broken, compression="snappy")
    data = bytearray(broken.read_bytes())
    chunk = pq.ParquetFile(broken).metadata.row_group(0).column(1)
    start = chunk.data_page_offset
    data[start : start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    broken.write_bytes(bytes(data))
    with (
        make_service(tmp_path) as service,
        pytest.raises(SourceFormatError, match=r"broken\.parquet.* is corrupt"),
    ):
        service.execute(Scan(str(broken)))
    use_host_cli(monkeypatch)
    assert main(["scan", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "broken.parquet" in err


def test_bad_out_exits_2_before_the_query_runs(
    env: Path, edges: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = ["graph", "pagerank", str(edges), "--src", "s", "--dst", "d"]
    for out, expected in ((env / "no" / "r.parquet", "does not exist"), (env, "is a directory")):
        capsys.readouterr()
        assert main([*graph, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert expected in err
        assert err.count("\n") == 1
    assert not (env / "no").exists()


def test_unknown_protocol_and_missing_filesystem_package_exit_2(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    cases = [("nosuchproto://bucket/x.parquet", "Protocol not known")]
    if importlib.util.find_spec("s3fs") is not None:  # no bucket: s3fs refuses to list
        cases.append(("s3://", "name a bucket and a path"))
    if importlib.util.find_spec("gcsfs") is None:  # fsspec knows gcs://, its package is absent
        cases.append(("gcs://bucket/x.parquet", "needs a package that is not installed"))
    for url, expected in cases:
        capsys.readouterr()
        assert main(["scan", url]) == 2, url
        err = capsys.readouterr().err
        assert expected in err
        assert err.count("\n") == 1


def test_a_bucketless_s3_source_fails_at_once_with_credentials_set(
    env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # With credentials set, asking whether s3:// was a table directory listed the
    # account's buckets first: seconds of retries where the endpoint does not answer
    s3fs = pytest.importorskip("s3fs")
    import socket
    import time

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        started = time.monotonic()
        assert main(["scan", "s3://"]) == 2
        assert time.monotonic() - started < 2.0
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    assert "name a bucket and a path" in capsys.readouterr().err


def test_weight_that_is_also_an_id_column(
    env: Path, edges: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["graph", "pagerank", str(edges), "--src", "s", "--dst", "d", "--weight", "d"]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 4


def test_hidden_and_underscore_directories_are_skipped(tmp_path: Path) -> None:
    source = tmp_path / "table"
    (source / "_temporary" / "0").mkdir(parents=True)  # a writer's uncommitted output
    (source / ".staging").mkdir()
    (source / "year=2024").mkdir()
    pq.write_table(pa.table({"x": [1, 2]}), source / "part-0.parquet")
    pq.write_table(pa.table({"x": [3]}), source / "year=2024" / "part-1.parquet")
    pq.write_table(pa.table({"x": [99]}), source / "_temporary" / "0" / "part-9.parquet")
    pq.write_table(pa.table({"x": [98]}), source / ".staging" / "part-8.parquet")
    pq.write_table(pa.table({"x": [97]}), source / "_common_metadata.parquet")
    with make_service(tmp_path) as service:
        assert service.execute(Scan(str(source))).table.column("x").to_pylist() == [1, 2, 3]
        assert service.execute(Count(f"file://{source}")).table.column("rows").to_pylist() == [3]


def test_hidden_directories_are_skipped_on_fsspec_filesystems(tmp_path: Path) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    root = f"/qa-hidden-{tmp_path.name}"
    for path, values in (
        ("part-0.parquet", [1]),
        ("_temporary/0/part-9.parquet", [99]),
        (".staging/part-8.parquet", [98]),
        ("year=2024/part-1.parquet", [2]),
    ):
        with fs.open(f"{root}/{path}", "wb") as handle:
            pq.write_table(pa.table({"x": values}), handle)
    try:
        with make_service(tmp_path) as service:
            for url in (f"memory://{root}", f"memory://{root}/"):
                assert service.execute(Scan(url)).table.column("x").to_pylist() == [1, 2]
    finally:
        fs.rm(root, recursive=True)


def test_queries_without_a_cache_root_are_granted_enough_to_run_once(tmp_path: Path) -> None:
    # No lakehouse root: plans carry no identity and no size. The grant must
    # still follow the data, or every query above min_grant_bytes ran twice.
    big = tmp_path / "big.parquet"
    pq.write_table(pa.table({"x": list(range(200_000))}), big)
    edges = tmp_path / "edges.parquet"
    pq.write_table(pa.table({"s": [i % 50 for i in range(400)], "d": list(range(400))}), edges)
    config = ServiceConfig(backend="host")
    assert config.lakehouse.root is None
    from nexus_cache.backends import HostBackend
    from nexus_cache.service import QueryService

    with QueryService(config, backend=HostBackend(device_total_bytes=1 << 30)) as service:
        for query in (
            Scan(str(big)),
            GraphQuery(Scan(str(edges)), "s", "d", "pagerank"),
            GraphQuery(Scan(str(edges)), "s", "d", "bfs", params={"source": 0}),
        ):
            result = service.execute(query)
            assert result.diagnostics.lakehouse["reason"] == "no_root"
            assert [a.outcome for a in result.diagnostics.attempts] == ["ok"], query


def test_an_estimate_past_the_device_asks_for_the_device(tmp_path: Path) -> None:
    # 1 MiB of barely compressible Parquet: grant_expansion=8 estimates ~8 MiB,
    # more than the 5 MiB device, though decoding needs under 2 MiB.
    big = tmp_path / "big.parquet"
    pq.write_table(pa.table({"x": list(range(200_000))}), big)
    from nexus_cache.backends import HostBackend
    from nexus_cache.service import DeviceSettings, QueryService

    device = DeviceSettings(0, cache_cap_bytes=0, managed_capacity_bytes="5MiB")
    config = ServiceConfig(backend="host", devices=[device])
    with QueryService(config, backend=HostBackend(device_total_bytes=64 << 20)) as service:
        result = service.execute(Scan(str(big)))
        (attempt,) = result.diagnostics.attempts
        assert attempt.outcome == "ok"
        assert attempt.grant_bytes == service.caches.ledger(0).snapshot().managed_capacity_bytes
    config = ServiceConfig(backend="host", devices=[device], min_grant_bytes="6MiB")
    with QueryService(config, backend=HostBackend(device_total_bytes=64 << 20)) as service:
        from nexus_cache.errors import AdmissionError

        with pytest.raises(AdmissionError, match="can never be admitted"):
            service.execute(Scan(str(big)))  # a floor past the device is still refused


def test_a_lakehouse_root_that_holds_something_else_exits_2(
    env: Path, edges: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # It exited 1 ("a retry may cure it"), though only a changed setting can.
    from nexus_cache.program import FileStreamProgramCache

    other = env / "program-cache"
    FileStreamProgramCache(other)[b"k"] = b"v"
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_ROOT", str(other))
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_POLICY", "fill_before_read")
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_MAX_BYTES", "1GiB")
    for argv in (
        ["scan", str(edges)],
        ["graph", "pagerank", str(edges), "--src", "s", "--dst", "d"],
    ):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "NEXUS_LAKEHOUSE_CACHE_ROOT" in err
        assert err.count("\n") == 1
    assert sorted(p.name for p in other.iterdir()) == ["entries", "tmp"]  # left untouched


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_filter_value_is_refused_when_the_query_is_made(value: float) -> None:
    # JSON carries no NaN or infinity: such a query could not reach a server (the
    # client's encoder raised a bare ValueError naming no filter) nor be evidence.
    for flt in ([("w", "<", value)], [[("w", "in", [1.0, value])]]):
        for make in (Scan, Count):
            with pytest.raises(ConfigError) as raised:
                make("/data/t", filter=flt)
            assert "predicate" in str(raised.value)
            assert "finite" in str(raised.value)
    graph = GraphQuery(Scan("/data/t", ["src", "dst"]), "src", "dst", "pagerank").to_dict()
    graph["edges"]["filter"] = [["w", ">", value]]
    with pytest.raises(ConfigError, match="finite"):
        as_query(json.dumps(graph))  # a ticket's text: Python's json reads NaN, Infinity
