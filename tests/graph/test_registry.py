"""The algorithm registry tells the truth, stays light and is the one list of algorithms."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nexus_cache
from nexus_cache.errors import ConfigError
from nexus_cache.graph import ALGORITHMS, GraphOptions, build_graph, get_spec
from nexus_cache.graph.memory import result_bytes, transient_bytes

PACKAGE = Path(nexus_cache.__file__).parent


def _small_graph(spec_name: str) -> object:
    spec = get_spec(spec_name)
    directed = not spec.undirected_only
    edges = {"src": np.array([0, 0, 1, 2, 3, 3]), "dst": np.array([1, 2, 2, 0, 3, 1])}
    # as the service builds it: float64 weights (PageRank's result type)
    return build_graph(edges, options=spec.options(directed, weight_dtype="float64"))


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_each_spec_runs_and_returns_the_columns_it_declares(name: str) -> None:
    spec = ALGORITHMS[name]
    graph = _small_graph(name)
    params = spec.validate(spec.sample_params(0))
    arguments = spec.arguments(params)
    table = spec.run(graph, **arguments).to_arrow()
    assert table.column_names == [c.name for c in spec.columns]
    assert [f.type for f in table.schema] == [c.arrow_type() for c in spec.columns]
    for column in spec.columns:
        if not column.nullable:
            assert table.column(column.name).null_count == 0, column.name
    rows = graph.n_vertices if spec.rows == "vertex" else 6  # type: ignore[attr-defined]
    assert table.num_rows <= rows
    assert spec.result_bytes(6, graph.n_vertices) >= table.nbytes  # type: ignore[attr-defined]
    assert transient_bytes(graph, name, arguments) > 0  # type: ignore[arg-type]
    assert set(spec.facts) <= set(spec.run(graph, **arguments).info)


def test_result_estimates_are_the_column_widths() -> None:
    # PageRank: id and rank; BFS: id, int32 distance, id predecessor and two
    # masks; a similarity: two ids and a score per pair
    assert result_bytes("pagerank", 10, 100) == 100 * 16 + 4096
    assert result_bytes("bfs", 10, 100) == 100 * 24 + 4096
    assert result_bytes("jaccard", 10, 100) == 10 * 24 + 4096
    assert result_bytes("degree", 10, 100) == 100 * 16 + 4096
    assert result_bytes("triangles", 10, 100) == 100 * 16 + 4096


def test_a_parameter_name_means_one_thing_across_algorithms() -> None:
    # the command line gives each parameter name one flag, typed once
    seen: dict[str, tuple[object, ...]] = {}
    for spec in ALGORITHMS.values():
        for param in spec.params:
            shape = (param.kind, param.choices, param.low, param.high, param.nullable)
            assert seen.setdefault(param.name, shape) == shape, param.name
            if param.required:
                assert param.kind == "vertex", "sample_params can only make up vertices"


@pytest.mark.parametrize(
    ("name", "given", "message"),
    [
        (
            "pagerank",
            {"alpha": 1.5},
            r"alpha=1.5 is not accepted for pagerank; use a number in \(0, 1\)",
        ),
        ("pagerank", {"alpha": float("nan")}, "alpha=nan is not accepted"),
        ("pagerank", {"tol": 0}, "use a number > 0"),
        ("pagerank", {"max_iter": True}, "use an int >= 1"),
        ("pagerank", {"convergence": "l2"}, "use one of: total, networkx"),
        ("bfs", {}, "source is required for bfs"),
        ("bfs", {"source": 2**63}, "use an integer vertex id"),
        ("bfs", {"source": 0, "depth_limit": -1}, "use an int >= 0 or null"),
        ("degree", {"direction": "both"}, "use one of: total, out, in"),
        (
            "jaccard",
            {"alpha": 0.5},
            r"alpha does not apply to jaccard; leave it out \(accepted: none\)",
        ),
    ],
)
def test_parameters_are_checked_with_messages_that_say_what_is_accepted(
    name: str, given: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        get_spec(name).validate(given)


def test_valid_parameters_take_defaults_and_map_to_the_function_keywords() -> None:
    bfs = get_spec("bfs")
    params = bfs.validate({"source": -(2**63)})
    assert params == {"source": -(2**63), "depth_limit": None}
    assert bfs.arguments(params) == {"sources": -(2**63), "depth_limit": None}
    assert get_spec("pagerank").validate({"max_iter": 5})["alpha"] == 0.85
    with pytest.raises(
        ConfigError, match="algorithm='sssp' is not accepted; use one of: pagerank"
    ):
        get_spec("sssp")


def test_the_construction_contract_comes_from_the_spec() -> None:
    assert get_spec("pagerank").options(True) == GraphOptions(
        orientation="transposed", duplicates="sum"
    )
    assert get_spec("degree").options(False) == GraphOptions(directed=False, duplicates="max")


def test_the_registry_imports_no_array_or_arrow_library() -> None:
    code = (
        "import sys, nexus_cache.graph.registry as r; r.get_spec('bfs').validate({'source': 1}); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'pyarrow', 'cupy')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _name_literals(path: Path, names: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append(f"{path}:{node.lineno}: {node.value!r}")
    return found


def test_no_algorithm_name_is_spelled_outside_the_graph_package() -> None:
    # One registry: the service, the caches, the CLI and the server read the
    # names from it, so adding an algorithm touches only nexus_cache.graph.
    names = set(ALGORITHMS)
    offences = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] != "graph":
            offences += _name_literals(path, names)
    assert offences == []


def test_the_literal_check_finds_a_spelled_out_name(tmp_path: Path) -> None:
    module = tmp_path / "queries.py"  # a real module, with one name spelled out
    text = (PACKAGE / "service" / "queries.py").read_text("utf-8")
    module.write_text(text + '\nWEIGHTED_NAMES = ("pagerank",)\n', "utf-8")
    assert _name_literals(PACKAGE / "service" / "queries.py", set(ALGORITHMS)) == []
    assert [f.rsplit(": ", 1)[1] for f in _name_literals(module, set(ALGORITHMS))] == [
        "'pagerank'"
    ]


def test_no_algorithm_module_hides_an_exported_function() -> None:
    # a module named like the package's export of its function would replace
    # that export as a package attribute once imported (degree in degrees.py)
    code = (
        "import importlib, types, nexus_cache.graph as g\n"
        "from nexus_cache.graph.registry import ALGORITHMS\n"
        "for spec in ALGORITHMS.values():\n"
        "    importlib.import_module(spec.runner.partition(':')[0])\n"
        "print(sorted(n for n in g.__all__ if isinstance(getattr(g, n), types.ModuleType)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
