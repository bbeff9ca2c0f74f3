"""Backend kinds stay in ``backends/``: no other module spells a backend or
allocator name, tests an array for CuPy or RMM types, or imports RMM.

Code outside ``backends/`` takes names from the registry
(``backends/kinds.py``) and asks a backend (``kind``, ``device_scope``) or a
domain (``host_memory``); the graph layer duck-types (``graph/arrays.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import nexus_cache
from nexus_cache.backends.kinds import ALLOCATORS, BACKENDS

PACKAGE = Path(nexus_cache.__file__).parent
NAMES = {kind.name for kind in BACKENDS} | {a.name for a in ALLOCATORS}
#: names under which code holds CuPy, cupyx or RMM
DEVICE_LIBRARIES = {"cupy", "cp", "cupyx", "rmm"}

#: (module, literal): the same words naming something else
ALLOWED_LITERALS = {
    # a kernel's origin "compiled by CuPy's own kernel cache", not the allocator
    ("_kernel_loader.py", "cupy"),
    ("cli/warmup.py", "cupy"),
    # the host attribute of an fsspec filesystem (a URL's host)
    ("lakehouse/identity/_identity.py", "host"),
    # NEXUS_DECODE_ENGINE=host: the host decoder threads, not the backend
    ("frames/_page_engine.py", "host"),
    ("frames/_variables.py", "host"),
}


def _outside_backends() -> list[Path]:
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] != "backends"
    ]


def _mentions_device_library(node: ast.AST) -> bool:
    """Whether an expression names CuPy/RMM or some library's ``ndarray`` but NumPy's."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in DEVICE_LIBRARIES:
            return True
        if isinstance(sub, ast.Attribute):
            if sub.attr in DEVICE_LIBRARIES:
                return True
            if sub.attr == "ndarray" and not (
                isinstance(sub.value, ast.Name) and sub.value.id in ("np", "numpy")
            ):
                return True
    return False


def offences(rel: str, text: str) -> list[str]:
    """What module ``rel`` (relative to the package) with source ``text`` does wrong."""
    found = []
    for node in ast.walk(ast.parse(text, rel)):
        where = f"{rel}:{getattr(node, 'lineno', '?')}"
        if (
            isinstance(node, ast.Constant)
            and node.value in NAMES
            and (rel, node.value) not in ALLOWED_LITERALS
        ):
            found.append(f"{where}: backend name literal {node.value!r}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
            and len(node.args) == 2
            and _mentions_device_library(node.args[1])
        ):
            found.append(f"{where}: type test {ast.unparse(node)}")
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            found += [f"{where}: imports {m}" for m in modules if m.split(".")[0] == "rmm"]
    return found


def test_no_backend_name_or_device_type_test_outside_backends() -> None:
    found = [
        offence
        for path in _outside_backends()
        for offence in offences(path.relative_to(PACKAGE).as_posix(), path.read_text("utf-8"))
    ]
    assert found == []


def test_the_allowed_literals_are_still_there() -> None:
    for rel, literal in ALLOWED_LITERALS:
        tree = ast.parse((PACKAGE / rel).read_text("utf-8"))
        assert any(isinstance(n, ast.Constant) and n.value == literal for n in ast.walk(tree)), (
            f"{rel} no longer holds {literal!r}: drop it from ALLOWED_LITERALS"
        )


def test_the_check_catches_what_it_forbids() -> None:
    sample = (
        "import sys\n"
        "import rmm\n"
        "def f(backend, a, cp, xp):\n"
        "    if backend.name != 'cuda':\n"
        "        return isinstance(a, cp.ndarray)\n"
        "    return getattr(xp, '__name__', '') == 'cupy' or sys.modules.get('cupy')\n"
        "def g(a, np, lib):\n"
        "    return isinstance(a, np.ndarray) or isinstance(a, lib.ndarray)\n"
    )
    found = offences("service/probe.py", sample)
    assert sum("literal 'cuda'" in o for o in found) == 1, found
    assert sum("literal 'cupy'" in o for o in found) == 2, found
    assert sum("imports rmm" in o for o in found) == 1, found
    assert sum("type test" in o for o in found) == 2, found  # cp's and lib's ndarray, not np's
    assert len(found) == 6, found
