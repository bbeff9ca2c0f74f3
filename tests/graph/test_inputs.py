"""Edge frames, options and refusals of nexus_cache.graph (host backend)."""

from __future__ import annotations

import importlib

import networkx as nx
import numpy as np
import pyarrow as pa
import pytest

from nexus_cache.errors import ConfigError, GraphConvergenceError, GraphInputError
from nexus_cache.graph import GraphOptions, bfs, build_graph, jaccard, pagerank, similarity

bfs_module = importlib.import_module("nexus_cache.graph.traversal")

EDGES = {"a": np.array([5, 7, 7, 9]), "b": np.array([7, 9, 9, 5]), "w": np.array([1, 2, 3, 4.0])}


def test_arrow_table_and_dict_give_the_same_graph() -> None:
    table = pa.table(EDGES)
    from_arrow = build_graph(table, source="a", destination="b", weight="w")
    from_dict = build_graph(EDGES, source="a", destination="b", weight="w")
    for x, y in zip(from_arrow.arrays(), from_dict.arrays(), strict=True):
        assert np.array_equal(x, y)
    assert from_arrow.weights.tolist() == [1.0, 5.0, 4.0]  # 7->9 twice, summed


def test_arrow_chunked_columns_and_record_batch() -> None:
    table = pa.concat_tables([pa.table(EDGES), pa.table(EDGES)])
    graph = build_graph(table.to_batches()[0], source="a", destination="b")
    assert graph.n_arcs == 3
    assert graph.vertex_ids.tolist() == [5, 7, 9]
    graph = build_graph(
        table, source="a", destination="b", options=GraphOptions(duplicates="keep")
    )
    assert graph.n_arcs == 8


@pytest.mark.parametrize(
    ("frame", "kwargs", "message"),
    [
        (EDGES, {"source": "x"}, "no column 'x'"),
        (pa.table({"src": [1, None], "dst": [2, 3]}), {}, "null values"),
        ({"src": np.array([1.5]), "dst": np.array([2])}, {}, "integer vertex ids"),
        (
            {"src": np.array([1]), "dst": np.array([2]), "w": np.array([np.nan])},
            {"weight": "w"},
            "NaN",
        ),
        ({"src": np.array([1, 2]), "dst": np.array([2])}, {}, "equal length"),
        (
            {"src": np.array([2**64 - 1], dtype=np.uint64), "dst": np.array([2], dtype=np.uint64)},
            {},
            "2\\*\\*63",
        ),
    ],
)
def test_bad_edge_frames_are_refused(frame: object, kwargs: dict, message: str) -> None:
    with pytest.raises(GraphInputError, match=message):
        build_graph(frame, **kwargs)


def test_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="duplicates='avg'"):
        GraphOptions(duplicates="avg")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="directed"):
        GraphOptions(directed=1)  # type: ignore[arg-type]
    graph = build_graph({"src": np.array([1]), "dst": np.array([2])})
    with pytest.raises(ConfigError, match="alpha"):
        pagerank(graph, alpha=float("nan"))
    with pytest.raises(ConfigError, match="max_iter"):
        pagerank(graph, max_iter=0)
    with pytest.raises(ConfigError, match="depth_limit"):
        bfs(graph, [1], depth_limit=-1)
    with pytest.raises(ConfigError, match="max_temp_bytes"):
        jaccard(graph, max_temp_bytes="lots")


def test_unknown_vertices_are_named() -> None:
    graph = build_graph({"src": np.array([1, 2]), "dst": np.array([2, 3])})
    with pytest.raises(GraphInputError, match=r"\[42\]"):
        bfs(graph, [1, 42])
    with pytest.raises(GraphInputError, match="personalization"):
        pagerank(graph, personalization=([1], [0.0]))
    with pytest.raises(GraphInputError, match="equal numbers"):
        jaccard(graph, ([1, 2], [3]))


def test_too_many_vertices_for_int32_is_refused() -> None:
    n = 3
    graph = build_graph({"src": np.arange(n), "dst": np.arange(n) + 1})
    assert graph.indices.dtype == np.int32
    from nexus_cache.graph import _build

    with pytest.raises(GraphInputError, match="vertex_dtype='int64'"):
        _build._check_vertex_count(2**31, np.dtype(np.int32))


def test_pagerank_reports_nonconvergence_or_raises() -> None:
    rng = np.random.default_rng(0)
    edges = {"src": rng.integers(0, 50, 300), "dst": rng.integers(0, 50, 300)}
    graph = build_graph(edges)
    result = pagerank(graph, max_iter=2, tol=1e-12)
    assert result.info["converged"] is False
    assert result.info["iterations"] == 2
    with pytest.raises(GraphConvergenceError, match="max_iter=2"):
        pagerank(graph, max_iter=2, tol=1e-12, fail_on_nonconvergence=True)
    done = pagerank(graph, tol=1e-6)
    assert done.info["converged"] is True
    assert done.info["error"] < 50 * 1e-6


def test_empty_graph() -> None:
    graph = build_graph({"src": np.zeros(0, np.int64), "dst": np.zeros(0, np.int64)})
    assert graph.n_vertices == 0
    assert graph.indptr.tolist() == [0]
    assert pagerank(graph).to_arrow().num_rows == 0
    assert jaccard(graph).to_arrow().num_rows == 0


def _push_pull_graph() -> tuple[np.ndarray, object]:
    rng = np.random.default_rng(1)
    # A long path into a dense core: top-down at first, bottom-up in the
    # core, top-down again for the sparse tail.
    core = rng.integers(0, 300, (6000, 2))
    tail = np.stack([np.arange(299, 329), np.arange(300, 330)], axis=1)
    head = np.stack([np.arange(-20, 0), np.arange(-19, 1)], axis=1)
    e = np.concatenate([head, core, tail])
    return e, build_graph({"src": e[:, 0], "dst": e[:, 1]}, options=GraphOptions(directed=False))


def test_both_bfs_steps_run_under_auto(monkeypatch: pytest.MonkeyPatch, host_engine: str) -> None:
    if host_engine != "numpy":
        pytest.skip("counts the NumPy steps; the kernel's steps: test_kernel_bfs_switches")
    calls = {"push": 0, "pull": 0}
    push, pull = bfs_module._push_step, bfs_module._pull_step

    def counted_push(*args: object) -> None:
        calls["push"] += 1
        push(*args)

    def counted_pull(*args: object) -> None:
        calls["pull"] += 1
        pull(*args)

    monkeypatch.setattr(bfs_module, "_push_step", counted_push)
    monkeypatch.setattr(bfs_module, "_pull_step", counted_pull)
    e, graph = _push_pull_graph()
    result = bfs(graph, [-20])
    assert calls["push"] >= 2
    assert calls["pull"] >= 1
    table = result.to_arrow().to_pydict()
    expected = nx.single_source_shortest_path_length(nx.Graph(e.tolist()), -20)
    assert dict(zip(table["vertex"], table["distance"], strict=True)) == expected


def test_result_is_a_mapping_with_nulls_in_arrow() -> None:
    graph = build_graph({"src": np.array([1, 3]), "dst": np.array([2, 4])})
    result = bfs(graph, [1])
    assert list(result) == ["vertex", "distance", "predecessor"]
    assert result.num_rows == 4
    table = result.to_arrow()
    assert table.column("distance").to_pylist() == [0, 1, None, None]
    assert table.column("predecessor").to_pylist() == [None, 1, None, None]


def test_device_frame_edges_on_the_host_backend() -> None:
    from nexus_cache.backends import HostBackend
    from nexus_cache.frames import DeviceFrame

    domain = HostBackend(device_total_bytes=1 << 20).create_domain(0)
    frame = DeviceFrame.from_arrow(pa.table(EDGES), domain=domain)
    graph = build_graph(frame, source="a", destination="b", weight="w")
    reference = build_graph(EDGES, source="a", destination="b", weight="w")
    for got, want in zip(graph.arrays(), reference.arrays(), strict=True):
        assert np.array_equal(got, want)
    nulls = DeviceFrame.from_arrow(pa.table({"src": [1, None], "dst": [2, 3]}), domain=domain)
    with pytest.raises(GraphInputError, match="null values"):
        build_graph(nulls)
    frame.release()
    nulls.release()


def test_bfs_without_sources_says_so() -> None:
    graph = build_graph({"src": np.array([1, 2]), "dst": np.array([2, 3])})
    for sources in ([], (), np.array([], dtype=np.int64)):
        with pytest.raises(GraphInputError, match="no sources"):
            bfs(graph, sources)


@pytest.mark.parametrize("bad", [float("inf"), -float("inf")])
def test_infinite_weights_are_refused_naming_the_column(bad: float) -> None:
    edges = {
        "src": np.array([0, 1, 2]),
        "dst": np.array([1, 2, 0]),
        "cost": np.array([1.0, bad, 3.0]),
    }
    with pytest.raises(GraphInputError, match="weight column 'cost' holds NaN or infinite"):
        build_graph(edges, weight="cost")


def test_weights_beyond_the_weight_dtype_are_refused_naming_the_column() -> None:
    # finite in float64, infinite once stored as float32
    edges = {"src": np.array([0, 1]), "dst": np.array([1, 0]), "cost": np.array([1e39, 1.0])}
    with pytest.raises(GraphInputError, match=r"weight column 'cost'.*weight_dtype='float64'"):
        build_graph(edges, weight="cost")
    # each copy fits float32, their sum does not
    twice = {
        "src": np.array([0, 0, 1]),
        "dst": np.array([1, 1, 0]),
        "cost": np.array([3e38, 3e38, 1], dtype=np.float32),
    }
    with pytest.raises(GraphInputError, match="after duplicate edges were summed"):
        build_graph(twice, weight="cost")
    wide = build_graph(twice, weight="cost", options=GraphOptions(weight_dtype="float64"))
    assert wide.weights.tolist() == [pytest.approx(6e38, rel=1e-6), 1.0]


def test_float64_weight_overflow_advises_scaling_not_float64() -> None:
    # the service and the command line build float64 graphs: advising
    # weight_dtype='float64' there names what is already the case
    twice = {"src": np.array([0, 0]), "dst": np.array([1, 1]), "cost": np.array([1.7e308] * 2)}
    wide = GraphOptions(weight_dtype="float64")
    with pytest.raises(GraphInputError, match="weight_dtype=float64") as refused:
        build_graph(twice, weight="cost", options=wide)
    assert "scale the weights down" in str(refused.value)
    assert "GraphOptions(weight_dtype='float64')" not in str(refused.value)


def test_pagerank_refuses_negative_weights_naming_the_column() -> None:
    edges = {
        "src": np.array([0, 1, 2, 0]),
        "dst": np.array([1, 2, 0, 2]),
        "cost": np.array([1.0, -2.0, 3.0, 1.0]),
    }
    graph = build_graph(edges, weight="cost")
    with pytest.raises(GraphInputError, match=r"weight column 'cost'.*negative"):
        pagerank(graph)
    edges["cost"] = np.array([1.0, 0.0, 3.0, 1.0])  # zero is a weight like any other
    ranks = pagerank(build_graph(edges, weight="cost"), tol=1e-10).to_arrow().to_pydict()
    G = nx.DiGraph()
    G.add_weighted_edges_from(zip([0, 1, 2, 0], [1, 2, 0, 2], [1.0, 0.0, 3.0, 1.0], strict=True))
    expected = nx.pagerank(G, tol=1e-12)
    for vertex, rank in zip(ranks["vertex"], ranks["pagerank"], strict=True):
        assert rank == pytest.approx(expected[vertex], abs=2e-5)


def test_float32_weights_near_their_limit_keep_the_rank_mass() -> None:
    # 2e38 + 2e38 overflows float32: the out-weight sum must not
    edges = {
        "src": np.array([0, 0, 0, 1, 2, 3]),
        "dst": np.array([1, 2, 3, 0, 0, 0]),
        "w": np.array([2e38, 2e38, 1, 1, 1, 1], dtype=np.float32),
    }
    graph = build_graph(edges, weight="w")
    result = pagerank(graph, tol=1e-8, max_iter=1000).to_arrow().to_pydict()
    assert sum(result["pagerank"]) == pytest.approx(1.0, abs=1e-5)
    G = nx.DiGraph()
    G.add_weighted_edges_from(
        zip(edges["src"].tolist(), edges["dst"].tolist(), edges["w"].tolist(), strict=True)
    )
    expected = nx.pagerank(G, tol=1e-12, max_iter=1000)
    for vertex, rank in zip(result["vertex"], result["pagerank"], strict=True):
        assert rank == pytest.approx(expected[vertex], abs=1e-5)


@pytest.mark.parametrize("directed", [True, False])
def test_repeated_edges_count_alike_with_or_without_weights(directed: bool) -> None:
    rng = np.random.default_rng(3)
    src, dst = rng.integers(0, 30, 400), rng.integers(0, 30, 400)  # many repeats
    options = GraphOptions(directed=directed, weight_dtype="float64")
    plain = build_graph({"src": src, "dst": dst}, options=options)
    ones = build_graph({"src": src, "dst": dst, "w": np.ones(400)}, weight="w", options=options)
    assert plain.weights.tolist() == ones.weights.tolist()
    assert plain.weights.max() > 1  # the repeats are counted
    got = pagerank(plain, tol=1e-12).to_arrow().to_pydict()
    assert got == pagerank(ones, tol=1e-12).to_arrow().to_pydict()
    multi = nx.MultiDiGraph() if directed else nx.MultiGraph()
    multi.add_edges_from(zip(src.tolist(), dst.tolist(), strict=True))
    expected = nx.pagerank(multi, weight=None, tol=1e-12)
    for vertex, rank in zip(got["vertex"], got["pagerank"], strict=True):
        assert rank == pytest.approx(expected[vertex], abs=1e-9)
    # without repeats nothing is stored: the graph stays unweighted
    once = build_graph({"src": np.array([1, 2]), "dst": np.array([2, 3])}, options=options)
    assert once.weights is None


@pytest.mark.parametrize("metric", ["jaccard", "sorensen", "overlap", "cosine"])
def test_no_pairs_give_an_empty_similarity(metric: str) -> None:
    graph = build_graph({"src": np.array([1, 2]), "dst": np.array([2, 3])})
    empty = build_graph({"src": np.zeros(0, np.int64), "dst": np.zeros(0, np.int64)})
    for g, pairs in [
        (graph, ([], [])),
        (graph, (np.zeros(0, np.int64), np.zeros(0, np.int64))),
        (empty, ([], [])),
        (empty, None),
    ]:
        table = similarity(g, metric, pairs).to_arrow()
        assert table.num_rows == 0
        assert table.column_names == ["first", "second", metric]
        assert table.schema.field(metric).type == pa.float64()


@pytest.mark.parametrize("dtype", ["int64", "bool", "complex128", "float16", "nonsense", object])
def test_pagerank_refuses_a_dtype_that_is_not_float32_or_float64(dtype: object) -> None:
    # an integer dtype failed deep in the iteration (numpy's UFuncTypeError),
    # a name numpy does not know with a bare TypeError
    graph = build_graph(EDGES, source="a", destination="b")
    with pytest.raises(ConfigError, match=r"pagerank dtype=.*'float32', 'float64'"):
        pagerank(graph, dtype=dtype)


def test_pagerank_dtype_float64_on_a_float32_graph_matches_networkx() -> None:
    graph = build_graph(EDGES, source="a", destination="b")
    ranks = pagerank(graph, dtype="float64", tol=1e-12).to_arrow().to_pydict()
    assert len(ranks["pagerank"]) == 3
    G = nx.MultiDiGraph(list(zip(EDGES["a"].tolist(), EDGES["b"].tolist(), strict=True)))
    expected = nx.pagerank(G, tol=1e-12)
    assert pagerank(graph, dtype=np.float64)["pagerank"].dtype == np.float64
    for vertex, rank in zip(ranks["vertex"], ranks["pagerank"], strict=True):
        assert rank == pytest.approx(expected[vertex], abs=1e-9)


@pytest.mark.parametrize("name", ["personalization", "dangling", "initial"])
def test_pagerank_vector_values_that_are_not_numbers_name_the_vector(name: str) -> None:
    # a bare ValueError ("could not convert string to float") named nothing
    graph = build_graph(EDGES, source="a", destination="b")
    with pytest.raises(GraphInputError, match=f"pagerank {name} values must be numbers"):
        pagerank(graph, **{name: ([5, 7], ["high", "low"])})


@pytest.mark.parametrize("huge", [2**64, 2**70, -(2**63) - 1])
def test_ids_beyond_int64_are_named_as_out_of_range_not_as_a_wrong_type(huge: int) -> None:
    # they were refused as "got dtype object; cast the column to an integer type"
    graph = build_graph(EDGES, source="a", destination="b")
    with pytest.raises(GraphInputError, match=rf"BFS sources \[{huge}\] are outside int64"):
        bfs(graph, huge)
    with pytest.raises(GraphInputError, match=r"first vertices of pairs .* outside int64"):
        jaccard(graph, ([5, huge], [7, 9]))
    assert bfs(graph, [5])["distance"].tolist() == [0, 1, 2]  # ids in range still work
