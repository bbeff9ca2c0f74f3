"""Rules of the package's shape, checked on every module's syntax tree
(``docs/architecture.md``).

* No shims: nothing is released yet, so nothing is deprecated. No module
  warns ``DeprecationWarning``, no module only re-exports another's names,
  and only a package ``__init__`` defines a module ``__getattr__`` (its lazy
  public names).
* One ``ALGORITHMS``: the graph algorithm registry's. Every other layer reads
  it (``nexus_cache.graph.registry``) and keeps no list of its own.
* No circles: the packages import one another without a cycle (every
  import counts, those inside functions and under ``TYPE_CHECKING``
  included), and no module imports the namespace of the package it belongs
  to (the package ``__init__`` imports its modules, never the reverse).
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import nexus_cache

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(nexus_cache.__file__).parent


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root: Path) -> dict[str, Path]:
    return {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text("utf-8"), str(path))


# --- no shims ---------------------------------------------------------------


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _only_re_exports(tree: ast.Module) -> bool:
    """True when the module's top level is imports, ``__all__`` and bare calls only."""
    own = 0
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom) or _is_docstring(node):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            continue  # a call for its effect: a warning, a registration
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if targets and all(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            continue
        own += 1
    return own == 0 and any(isinstance(n, ast.ImportFrom) for n in tree.body)


def shim_offences(name: str, path: Path) -> list[str]:
    """What makes module ``name`` (at ``path``) a deprecation shim, if anything."""
    tree = _tree(path)
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Name) and node.id == "DeprecationWarning") or (
            isinstance(node, ast.Attribute) and node.attr == "DeprecationWarning"
        ):
            out.append(f"{name}:{node.lineno}: warns DeprecationWarning")
    if path.name != "__init__.py":
        if _only_re_exports(tree):
            out.append(f"{name}: only re-exports names defined elsewhere")
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                out.append(f"{name}:{node.lineno}: a module __getattr__ outside a package init")
    return out


def test_no_module_is_a_shim() -> None:
    found = [o for name, path in _modules(ROOT).items() for o in shim_offences(name, path)]
    assert found == []


def test_the_shim_check_catches_the_three_kinds(tmp_path: Path) -> None:
    pkg = tmp_path / "nexus_cache"
    pkg.mkdir()
    (pkg / "moved.py").write_text(
        '"""Deprecated path of another module."""\n'
        "from __future__ import annotations\n"
        "from nexus_cache.somewhere import Thing\n"
        '__all__ = ["Thing"]\n'
        "warn_moved(__name__, 'nexus_cache.somewhere')\n"
    )
    (pkg / "renamed.py").write_text(
        "import warnings\n"
        "class New: ...\n"
        "def __getattr__(name):\n"
        "    if name == 'Old':\n"
        "        warnings.warn('Old is New', DeprecationWarning, stacklevel=2)\n"
        "        return New\n"
        "    raise AttributeError(name)\n"
    )
    (pkg / "fine.py").write_text(
        "from nexus_cache.somewhere import Thing\n"
        "__all__ = ['Wrapper']\n"
        "class Wrapper(Thing): ...\n"
    )
    found = {name: shim_offences(name, path) for name, path in _modules(pkg).items()}
    assert found["nexus_cache.moved"] == [
        "nexus_cache.moved: only re-exports names defined elsewhere"
    ]
    assert found["nexus_cache.renamed"] == [
        "nexus_cache.renamed:5: warns DeprecationWarning",
        "nexus_cache.renamed:3: a module __getattr__ outside a package init",
    ]
    assert found["nexus_cache.fine"] == []


# --- one ALGORITHMS ---------------------------------------------------------

REGISTRY = "nexus_cache.graph.registry"


def _top_level_names(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    yield node.lineno, target.id
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            yield node.lineno, node.target.id


def algorithms_offences(modules: Mapping[str, Path]) -> list[str]:
    """Every ``ALGORITHMS`` defined or exported outside the registry."""
    out = []
    for name, path in modules.items():
        tree = _tree(path)
        for line, assigned in _top_level_names(tree):
            if assigned == "ALGORITHMS" and name != REGISTRY:
                out.append(f"{name}:{line}: defines its own ALGORITHMS")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nexus_cache"):
                for alias in node.names:
                    public = (alias.asname or alias.name) == "ALGORITHMS"
                    if public and node.module not in (REGISTRY, "nexus_cache.graph"):
                        out.append(f"{name}:{node.lineno}: ALGORITHMS from {node.module}")
            if isinstance(node, ast.Dict):  # a lazy _EXPORTS map
                for key, value in zip(node.keys, node.values, strict=True):
                    if (
                        isinstance(key, ast.Constant)
                        and key.value == "ALGORITHMS"
                        and isinstance(value, ast.Constant)
                        and value.value != REGISTRY
                    ):
                        out.append(f"{name}:{key.lineno}: exports ALGORITHMS of {value.value}")
    return out


def test_the_registry_holds_the_one_algorithms() -> None:
    assert algorithms_offences(_modules(ROOT)) == []
    packages = [n for n, p in _modules(ROOT).items() if p.name == "__init__.py"]
    exporters = [n for n in packages if "ALGORITHMS" in importlib.import_module(n).__all__]
    assert exporters == ["nexus_cache.graph"]
    from nexus_cache.graph import ALGORITHMS
    from nexus_cache.graph.registry import ALGORITHMS as IN_REGISTRY

    assert ALGORITHMS is IN_REGISTRY


def test_the_algorithms_check_catches_a_second_list(tmp_path: Path) -> None:
    pkg = tmp_path / "nexus_cache"
    (pkg / "graph").mkdir(parents=True)
    (pkg / "graph" / "registry.py").write_text("ALGORITHMS = {}\n")
    (pkg / "key.py").write_text(
        "from nexus_cache.graph.registry import ALGORITHMS as _SPECS\nALGORITHMS = tuple(_SPECS)\n"
    )
    (pkg / "reexport.py").write_text("from nexus_cache.device.key import ALGORITHMS\n")
    (pkg / "__init__.py").write_text(
        "_EXPORTS = {'ALGORITHMS': 'nexus_cache.device.key', 'Other': 'x'}\n"
    )
    assert algorithms_offences(_modules(pkg)) == [
        "nexus_cache:1: exports ALGORITHMS of nexus_cache.device.key",
        "nexus_cache.key:2: defines its own ALGORITHMS",
        "nexus_cache.reexport:1: ALGORITHMS from nexus_cache.device.key",
    ]


# --- no circles ---------------------------------------------------------------


def _imported(path: Path, modules: Mapping[str, Path]) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every import of ours in ``path``; ``from P import m``
    of a submodule ``m`` counts as an import of ``P.m``, not of ``P``."""
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            if all(s in modules for s in subs):
                yield from ((node.lineno, s) for s in subs)
            else:
                yield node.lineno, node.module


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def package_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Top-level package -> the top-level packages its modules import (the
    root facade, which re-exports every package, left out)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if name == "nexus_cache":
            continue
        edges = graph.setdefault(_package(name), set())
        for _, target in _imported(path, modules):
            if target.startswith("nexus_cache.") and _package(target) != _package(name):
                edges.add(_package(target))
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One path per import cycle found, from each node that starts one."""
    found = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt == path[0]:
                found.append([*path, nxt])
            elif nxt not in path:
                visit(nxt, [*path, nxt])

    for start in sorted(graph):
        visit(start, [start])
    return found


def upward_imports(modules: Mapping[str, Path]) -> list[str]:
    """Imports of a module's own package namespace (an ancestor ``__init__``),
    the root facade left out."""
    out = []
    for name, path in modules.items():
        own = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for line, target in _imported(path, modules):
            is_package = target in modules and modules[target].name == "__init__.py"
            above = own == target or own.startswith(target + ".")
            if is_package and above and target != "nexus_cache" and name != target:
                out.append(f"{name}:{line}: imports {target}, its own package")
    return out


def test_the_packages_import_one_another_without_a_circle() -> None:
    graph = package_graph(_modules(ROOT))
    assert "nexus_cache.device" in graph["nexus_cache.service"]  # the graph is real
    assert cycles(graph) == []


def test_no_module_imports_its_own_package() -> None:
    assert upward_imports(_modules(ROOT)) == []


def test_the_circle_checks_catch_a_cycle_and_an_upward_import(tmp_path: Path) -> None:
    pkg = tmp_path / "nexus_cache"
    for sub in ("a", "b", "c"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from nexus_cache.a import x\n")
    (pkg / "a" / "m.py").write_text("def f():\n    from nexus_cache.b.n import y\n")
    (pkg / "b" / "n.py").write_text("from nexus_cache.a import m\nimport nexus_cache.b\n")
    (pkg / "b" / "o.py").write_text("from nexus_cache.b import n\n")  # a submodule: fine
    (pkg / "c" / "p.py").write_text("from nexus_cache import a\n")  # the root facade: fine
    modules = _modules(pkg)
    assert cycles(package_graph(modules)) == [
        ["nexus_cache.a", "nexus_cache.b", "nexus_cache.a"],
        ["nexus_cache.b", "nexus_cache.a", "nexus_cache.b"],
    ]
    assert upward_imports(modules) == ["nexus_cache.b.n:2: imports nexus_cache.b, its own package"]


# --- imports the tools see ----------------------------------------------------

#: modules that import a module named by data: the lazy exports' map, the
#: CLI's areas and the registry's ``module:function`` of each algorithm
NAMED_BY_DATA = {
    "nexus_cache._lazy",
    "nexus_cache.cli.main",
    "nexus_cache.graph.registry",
}


def dynamic_imports(modules: Mapping[str, Path]) -> list[str]:
    """``importlib.import_module`` calls that may load a module of ours (any
    argument but a literal naming another distribution's module)."""
    out = []
    for name, path in modules.items():
        for node in ast.walk(_tree(path)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute | ast.Name)
                and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
                == "import_module"
            ):
                arg = node.args[0] if node.args else None
                value = arg.value if isinstance(arg, ast.Constant) else None
                if isinstance(value, str) and not value.startswith("nexus_cache"):
                    continue
                if name not in NAMED_BY_DATA:
                    out.append(f"{name}:{node.lineno}: import_module({ast.unparse(arg or node)})")
    return out


def test_modules_of_ours_load_through_import_statements() -> None:
    # a plain import inside a function is as lazy, and type checkers follow it
    assert dynamic_imports(_modules(ROOT)) == []


def test_the_import_check_catches_importlib(tmp_path: Path) -> None:
    pkg = tmp_path / "nexus_cache"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "import importlib\n"
        "from importlib import import_module\n"
        "def f(module):\n"
        "    importlib.import_module(f'nexus_cache.graph.{module}')\n"
        "    import_module('nexus_cache.graph.csr')\n"
        "    importlib.import_module('nvidia.nvcomp')\n"
    )
    assert dynamic_imports(_modules(pkg)) == [
        "nexus_cache.m:4: import_module(f'nexus_cache.graph.{module}')",
        "nexus_cache.m:5: import_module('nexus_cache.graph.csr')",
    ]


# --- the version ----------------------------------------------------------------


def test_the_version_is_written_once_in_its_module() -> None:
    pyproject = tomllib.loads((ROOT.parents[1] / "pyproject.toml").read_text("utf-8"))
    assert "version" not in pyproject["project"]
    assert "version" in pyproject["project"]["dynamic"]
    attr = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "nexus_cache._version.__version__"
    assigned = [
        name
        for name, path in _modules(ROOT).items()
        for _, target in _top_level_names(_tree(path))
        if target == "__version__"
    ]
    assert assigned == ["nexus_cache._version"]
    from nexus_cache._version import __version__

    assert nexus_cache.__version__ == __version__


# --- an attempt -------------------------------------------------------------------


def test_an_attempt_runs_each_query_kind_in_a_function_of_its_own() -> None:
    from typing import get_args

    from nexus_cache.service.queries import Query

    tree = _tree(ROOT / "service" / "_attempt.py")
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    runners = {f"_run_{kind.kind}" for kind in get_args(Query)}
    assert runners == {"_run_count", "_run_scan", "_run_graph"}
    assert runners <= set(functions)
    front = functions["run_attempt"]
    called = {
        n.func.id
        for n in ast.walk(front)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    assert runners <= called
    assert front.end_lineno is not None
    assert front.end_lineno - front.lineno < 40, "run_attempt dispatches; the kinds run apart"


# --- the server's imports -----------------------------------------------------


def facade_imports(modules: Mapping[str, Path], package: str) -> list[str]:
    """Imports from the root facade (``from nexus_cache import X``) in ``package``'s
    modules: the server names the module that defines what it uses."""
    out = []
    for name, path in modules.items():
        if not (name == package or name.startswith(package + ".")):
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module == "nexus_cache":
                names = ", ".join(a.name for a in node.names)
                out.append(f"{name}:{node.lineno}: from nexus_cache import {names}")
    return out


def test_server_modules_import_errors_and_the_version_from_their_modules() -> None:
    assert facade_imports(_modules(ROOT), "nexus_cache.server") == []


def test_the_facade_check_catches_an_import_through_the_package(tmp_path: Path) -> None:
    pkg = tmp_path / "nexus_cache"
    (pkg / "server").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "server" / "__init__.py").write_text("")
    (pkg / "server" / "a.py").write_text(
        "import nexus_cache.errors as errors\n"
        "from nexus_cache.errors import ConfigError\n"
        "from nexus_cache import errors\n"
        "def f():\n"
        "    from nexus_cache import __version__\n"
    )
    (pkg / "other.py").write_text("from nexus_cache import errors\n")  # not the server
    assert facade_imports(_modules(pkg), "nexus_cache.server") == [
        "nexus_cache.server.a:3: from nexus_cache import errors",
        "nexus_cache.server.a:5: from nexus_cache import __version__",
    ]
