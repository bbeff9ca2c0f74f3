"""The CLI is a client of the library: it imports only public names of other packages.

A leading underscore means internal (the package's naming rule). Any module
under ``nexus_cache/cli`` that imports an underscored module or name of
another package, or a name missing from the ``__all__`` of the module it
imports from, fails here.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import nexus_cache.cli

CLI_DIR = Path(nexus_cache.cli.__file__).parent
# The package-wide size grammar and formatter, and the strict number parsers:
# every option must use them (one parser each, never a second one in the CLI);
# and the one atomic publish path, for the files a user names (--out).
ALLOWED_PRIVATE = {"nexus_cache._sizes", "nexus_cache._numbers", "nexus_cache._storage"}


def _cli_modules() -> list[Path]:
    return sorted(CLI_DIR.rglob("*.py"))


def _internal(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """``(line, module, names)`` of every absolute import in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}:{node.lineno}: use absolute imports"
            found.append((node.lineno, node.module or "", [a.name for a in node.names]))
    return found


def violations(path: Path) -> list[str]:
    out = []
    for line, module, names in _imports(path):
        if not module.startswith("nexus_cache"):
            continue
        where = f"{path.name}:{line}"
        if module == "nexus_cache.cli" or module.startswith("nexus_cache.cli."):
            continue  # the CLI's own modules, private helpers included
        if module in ALLOWED_PRIVATE:
            continue
        parts = module.split(".")
        if any(_internal(part) for part in parts):
            out.append(f"{where}: imports internal module {module}")
            continue
        target = importlib.import_module(module)
        public = set(getattr(target, "__all__", ()))
        for name in names:
            if _internal(name):
                out.append(f"{where}: imports internal name {module}.{name}")
            elif name not in public and not _is_public_submodule(module, name):
                out.append(f"{where}: {module}.{name} is not in {module}.__all__")
    return out


def _is_public_submodule(package: str, name: str) -> bool:
    if not hasattr(importlib.import_module(package), "__path__"):
        return False  # a module, not a package: it has no submodules
    try:
        importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError:
        return False
    return True


@pytest.mark.parametrize("path", _cli_modules(), ids=lambda p: p.name)
def test_cli_module_imports_only_public_names(path: Path) -> None:
    assert violations(path) == []


def test_the_check_catches_private_imports(tmp_path: Path) -> None:
    bad = tmp_path / "probe.py"
    source = (
        "from nexus_cache.program._paths import default_sqlite_path\n"
        "from nexus_cache.lakehouse import _not_there\n"
        "import nexus_cache.device._figures\n"
        "from nexus_cache.lakehouse import ENV_ROOT_IS_NOT_EXPORTED\n"
    )
    bad.write_text(source, "utf-8")
    found = violations(bad)
    assert len(found) == 4, found
    assert "internal module nexus_cache.program._paths" in found[0]
    assert "internal name nexus_cache.lakehouse._not_there" in found[1]
    assert "internal module nexus_cache.device._figures" in found[2]
    assert "not in nexus_cache.lakehouse.__all__" in found[3]
