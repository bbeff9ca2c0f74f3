"""The shape of the lakehouse package: the read in one place, helpers that answer.

``Scanner.open`` (``lakehouse/_scan.py``) owns every read from source to handle;
the sub-packages it uses (``identity/``, ``store/``, ``fill/``) return results
and never import the read path back, and one read moves between the modules at
most half as often as before the read was gathered there (measured by
``benchmarks/read_walk.py``).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

import nexus_cache.lakehouse

PACKAGE = Path(nexus_cache.lakehouse.__file__).parent
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

#: each sub-package's modules
SUBPACKAGES = {
    "identity": {"_identity", "_known", "_proofs", "_remote"},
    "store": {"_store", "_pins", "_durable", "_maintenance"},
    "fill": {"_fill", "_background", "_limits"},
}
#: the read path: plans, handles, the cache facade and the fsspec filesystem
READ_PATH = {"_scan", "_reader", "_cache", "_fs"}
#: what each sub-package may import of its siblings (helpers below, never above)
MAY_USE = {"identity": set(), "store": {"identity"}, "fill": {"identity", "store"}}

#: returns of one read (benchmarks/read_walk.py) before the read was gathered
#: in Scanner.open; the walk must stay at most half of them
BEFORE = {"local cold": 35, "local hit": 36, "remote cold": 43, "remote hit": 38}


def _lakehouse_imports(path: Path) -> set[str]:
    """The ``nexus_cache.lakehouse`` modules ``path`` imports, relative to the package."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name.startswith("nexus_cache.lakehouse."):
                found.add(name[len("nexus_cache.lakehouse.") :])
    return found


def layout_violations(package: Path) -> list[str]:
    out = []
    for sub, modules in SUBPACKAGES.items():
        have = {p.stem for p in (package / sub).glob("_*.py") if p.name != "__init__.py"}
        if have != modules:
            out.append(f"{sub}/ holds {sorted(have)}, expected {sorted(modules)}")
        for path in sorted((package / sub).glob("*.py")):
            for name in sorted(_lakehouse_imports(path)):
                top = name.split(".")[0]
                if top in READ_PATH:
                    out.append(f"{sub}/{path.name} imports the read path: {name}")
                elif top in SUBPACKAGES and top != sub and top not in MAY_USE[sub]:
                    out.append(f"{sub}/{path.name} imports {name}, above it")
    flat = {p.stem for p in package.glob("_*.py")}
    for modules in SUBPACKAGES.values():
        if flat & modules:
            out.append(f"still flat in lakehouse/: {sorted(flat & modules)}")
    return out


def test_the_sub_packages_hold_their_modules_and_never_call_back() -> None:
    assert layout_violations(PACKAGE) == []


def test_the_check_catches_a_helper_that_imports_the_read_path(tmp_path: Path) -> None:
    for sub, modules in SUBPACKAGES.items():
        (tmp_path / sub).mkdir()
        for name in modules:
            (tmp_path / sub / f"{name}.py").write_text("")
    (tmp_path / "store" / "_pins.py").write_text(
        "from nexus_cache.lakehouse._scan import Scanner\n"
        "from nexus_cache.lakehouse.fill import _fill\n"
    )
    (tmp_path / "_known.py").write_text("")  # an old flat module left behind
    found = layout_violations(tmp_path)
    assert found == [
        "store/_pins.py imports the read path: _scan",
        "store/_pins.py imports the read path: _scan.Scanner",
        "store/_pins.py imports fill, above it",
        "store/_pins.py imports fill._fill, above it",
        "still flat in lakehouse/: ['_known']",
    ], found


def _read_walk() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nexus_read_walk", BENCHMARKS / "read_walk.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_read_returns_to_a_module_at_most_half_as_often_as_before(tmp_path: Path) -> None:
    walks = _read_walk().measure_walks(tmp_path)
    assert set(walks) == set(BEFORE)
    for name, walk in walks.items():
        assert walk.returns <= BEFORE[name] // 2, (name, walk.to_dict(), walk.stays)
        # the read is planned and executed in one place: _scan, entered once
        # from the cache and never re-entered from a helper before the handle
        first = walk.stays.index("_scan")
        handle = walk.stays.index("_reader", first)
        assert "_cache" not in walk.stays[first:handle], (name, walk.stays)


@pytest.mark.parametrize("name", ["_scan", "_cache"])
def test_the_cache_keeps_lifetime_and_maintenance_and_the_scanner_reads(name: str) -> None:
    tree = ast.parse((PACKAGE / f"{name}.py").read_text("utf-8"))
    methods = {
        node.name
        for cls in tree.body
        if isinstance(cls, ast.ClassDef) and cls.name in ("Scanner", "LakehouseCache")
        for node in cls.body
        if isinstance(node, ast.FunctionDef)
    }
    if name == "_scan":
        assert {"open", "plan", "execute", "close"} <= methods
    else:  # no read loop of its own: open hands the read to Scanner.open
        assert "_open" not in methods
        assert "_schedule_fill" not in methods
