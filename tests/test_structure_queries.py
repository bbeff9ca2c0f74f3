"""One front door for queries (``docs/architecture.md``): the query language lives in
``service/queries.py`` only.

* The front ends (``server/``, ``client/``, ``cluster/``) never build a
  ``Scan``, ``Count`` or ``GraphQuery``: they hand what they receive to
  ``as_query``/``as_request``.
* They parse no JSON but the documents listed in ``NOT_QUERIES`` (results,
  diagnostics, errors): a ticket's or a query's JSON is read in ``queries.py``.
* "The scan a query reads" is ``query.scan``: no module outside ``queries.py``
  picks ``query.edges if isinstance(query, GraphQuery) else query``.
* A ``ServiceConfig`` is rebuilt from its fields only inside ``service/``
  (``ServiceConfig.from_json``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import nexus_cache

ROOT = Path(nexus_cache.__file__).parent
FRONT_ENDS = ("server", "client", "cluster")
QUERY_KINDS = {"Scan", "Count", "GraphQuery"}
# (module, function) of the front ends that parse JSON which is not a query
NOT_QUERIES = {
    ("nexus_cache.server.wire", "split_diagnostics"),
    ("nexus_cache.server.wire", "decode_error"),
    ("nexus_cache.client.client", "plan"),
    ("nexus_cache.client.client", "_action"),
    ("nexus_cache.client.client", "_cancel"),
}


def _module(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _called(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        inner = func.value
        prefix = inner.id + "." if isinstance(inner, ast.Name) else ""
        return prefix + func.attr
    return ""


def _is_graph_check(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Call)
        and _called(test) == "isinstance"
        and len(test.args) == 2
        and "GraphQuery" in ast.dump(test.args[1])
    )


def violations(root: Path) -> list[str]:
    """Every break of the rules above in the package at ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = _module(path, root)
        parts = module.split(".")
        if module.endswith("service.queries"):
            continue
        front = len(parts) > 1 and parts[1] in FRONT_ENDS
        inside_service = len(parts) > 1 and parts[1] == "service"
        tree = ast.parse(path.read_text("utf-8"), str(path))
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        owner = {
            id(inner): f.name
            for f in functions
            for inner in ast.walk(f)
            if isinstance(inner, ast.Call)
        }
        where = f"{path.relative_to(root.parent)}"
        for node in ast.walk(tree):
            if isinstance(node, ast.IfExp) and _is_graph_check(node.test):
                found.append(f"{where}:{node.lineno}: use query.scan, the scan a query reads")
            if not isinstance(node, ast.Call):
                continue
            name = _called(node)
            short = name.rsplit(".", 1)[-1]
            if front and short in QUERY_KINDS:
                found.append(f"{where}:{node.lineno}: builds a {short}; use as_query")
            parses = front and name in ("json.loads", "json.load")
            if parses and (module, owner.get(id(node), "")) not in NOT_QUERIES:
                found.append(f"{where}:{node.lineno}: parses JSON; queries enter by as_query")
            if short == "ServiceConfig" and not inside_service:
                found.append(f"{where}:{node.lineno}: rebuilds a ServiceConfig; use from_json")
    return found


def test_the_query_language_lives_in_queries_py_only() -> None:
    assert violations(ROOT) == []


def test_the_json_allowlist_names_only_functions_that_parse_json() -> None:
    for module, function in NOT_QUERIES:
        path = ROOT.parent.joinpath(*module.split(".")).with_suffix(".py")
        tree = ast.parse(path.read_text("utf-8"))
        bodies = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        assert any(
            f.name == function
            and any(isinstance(c, ast.Call) and _called(c) == "json.loads" for c in ast.walk(f))
            for f in bodies
        ), (module, function)


def test_the_check_catches_each_kind_of_second_door(tmp_path: Path) -> None:
    package = tmp_path / "nexus_cache"
    for sub in ("server", "client", "cluster", "service", "cli"):
        (package / sub).mkdir(parents=True)
    (package / "server" / "tickets.py").write_text(
        "import json\n"
        "def parse(raw):\n"
        "    data = json.loads(raw)\n"
        "    return queries.Scan(**data)\n"
    )
    (package / "client" / "client.py").write_text(
        "def _query(d):\n    return GraphQuery(edges=Scan(d['source']), src='s')\n"
    )
    (package / "cluster" / "_wire.py").write_text(
        "def back(data):\n    return ServiceConfig(**data)\n"
    )
    (package / "service" / "demo.py").write_text(
        "def source(q):\n    return (q.edges if isinstance(q, GraphQuery) else q).source\n"
    )
    # allowed: the CLI builds queries from its options; the service its config
    (package / "cli" / "scan.py").write_text("def run(a):\n    return Scan(a.url)\n")
    (package / "service" / "config.py").write_text("def f(d):\n    return ServiceConfig(**d)\n")
    found = "\n".join(violations(package))
    assert "server/tickets.py:3: parses JSON" in found
    assert "server/tickets.py:4: builds a Scan" in found
    assert "client/client.py:2: builds a GraphQuery" in found
    assert "client/client.py:2: builds a Scan" in found
    assert "cluster/_wire.py:2: rebuilds a ServiceConfig" in found
    assert "service/demo.py:2: use query.scan" in found
    assert "cli/" not in found
    assert "service/config.py" not in found
