"""Structure the device layer promises: no import cycles, one owner per state."""

from __future__ import annotations

import ast
from pathlib import Path

import nexus_cache
from nexus_cache.device import TRANSITIONS, DeviceLedger, ResidencyState

S = ResidencyState
PACKAGE = Path(nexus_cache.__file__).parent
LAYER = sorted((PACKAGE / "device").rglob("*.py")) + sorted((PACKAGE / "backends").glob("*.py"))


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_device_and_backend_modules_import_without_cycles() -> None:
    names = {_module(p): p for p in LAYER}
    graph = {
        name: {m for m in _imports(path) if m in names and m != name}
        for name, path in names.items()
        if not name.endswith(("device", "backends"))  # package __init__ re-exports only
    }
    assert "nexus_cache.device.residency" in graph["nexus_cache.device.ledger"]
    assert "nexus_cache.device.ledger" not in graph["nexus_cache.device.residency"]

    def visit(node: str, path: tuple[str, ...]) -> None:
        for nxt in graph.get(node, ()):
            assert nxt not in path, f"import cycle: {' -> '.join((*path, nxt))}"
            visit(nxt, (*path, nxt))

    for name in graph:
        visit(name, (name,))


def test_no_module_writes_or_calls_a_collaborators_underscored_names() -> None:
    offences = []
    for path in LAYER:
        tree = ast.parse(path.read_text())
        # names this module defines itself: calling those is the module's own business
        own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr.startswith("_")
                    and not (isinstance(target.value, ast.Name) and target.value.id == "self")
                ):
                    offences.append(f"{path.name}:{node.lineno} writes .{target.attr}")
            func = node.func if isinstance(node, ast.Call) else None
            if (
                isinstance(func, ast.Attribute)
                and func.attr.startswith("_")
                and func.attr not in own
            ):
                node = func
                owner = node.value
                if isinstance(owner, ast.Attribute) and owner.attr.startswith("_"):
                    owner_name = owner.attr
                else:
                    owner_name = owner.id if isinstance(owner, ast.Name) else ""
                # self._ledger._x, self._backend._x: reaching into a collaborator
                if owner_name.startswith("_") and not node.attr.startswith("__"):
                    offences.append(f"{path.name}:{node.lineno} reaches {owner_name}.{node.attr}")
    assert offences == []


def test_pin_edges_taken_inline_are_edges_of_the_state_table() -> None:
    assert S.PINNED in TRANSITIONS[S.EVICTABLE]
    assert S.EVICTABLE in TRANSITIONS[S.PINNED]
    ledger = DeviceLedger(0, 10_000, 5_000)
    entry = ledger.reserve(100)
    entry.publish(100)
    handle = entry.pin()
    assert entry.state is S.PINNED
    assert ledger.snapshot().cache_pinned_in_use_bytes == 100
    handle.release()
    assert entry.state is S.EVICTABLE
    assert ledger.snapshot().cache_evictable_resident_bytes == 100
