"""The package convention (``docs/architecture.md``, "Packages and privacy"), for every package.

* Each package's ``__init__`` defines ``__all__`` and exports its public
  names lazily: a ``_EXPORTS`` map (name -> the absolute name of the module
  that defines it) handed to ``nexus_cache._lazy.lazy_exports``, and the same
  names imported from the same modules under ``if TYPE_CHECKING:``, so type
  checkers see the real types. It imports nothing of ours eagerly beyond
  ``_lazy`` and the import-time effects listed in ``EAGER``.
* Across packages, a module imports only public names: never an underscored
  module or name of a package it is not part of, and only names that the
  module it imports from lists in ``__all__`` (or that module's public
  submodules). The package-wide internals at the top (``nexus_cache._lazy``,
  ``_env``, ``_sizes``, ``_numbers``, ``_storage``, ``_kernel_loader``) are part
  of ``nexus_cache``, so every package may use their ``__all__``.

The allowlists name what does not follow the convention yet; they only shrink.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import nexus_cache

ROOT = Path(nexus_cache.__file__).parent

# Packages whose __init__ is not (yet) the lazy form with its TYPE_CHECKING mirror.
NOT_LAZY_YET: set[str] = set()

# Eager imports a package __init__ makes for an effect at import time.
EAGER = {
    # cuda.core's Program.compile(cache=...) accepts our caches
    ("nexus_cache.program", "nexus_cache.program._interop"),
    # fsspec's nexus:// protocol is registered when the package is imported
    ("nexus_cache.lakehouse", "nexus_cache.lakehouse._fs"),
}

# Cross-package imports of names missing from the __all__ they come from:
# (importing module, imported module, name).
NOT_IN_ALL_YET: set[tuple[str, str, str]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
PACKAGES = sorted(_module_name(p) for p in MODULES.values() if p.name == "__init__.py")


def _internal(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _scope(parts: list[str]) -> str:
    """The package whose modules share the internals of ``parts``: its top-level package."""
    return ".".join(parts[:2]) if len(parts) > 2 else ".".join(parts[:1])


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """``(line, module, names)`` of every import of ours in ``path``, nested ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: use absolute imports"
            found.append((node.lineno, node.module or "", [a.name for a in node.names]))
    return [f for f in found if _inside(f[1], "nexus_cache")]


def _is_submodule(module: str, name: str) -> bool:
    return f"{module}.{name}" in MODULES


def privacy_violations(importer: str, path: Path) -> list[str]:
    out = []
    for line, module, names in _imports(path):
        where = f"{importer}:{line}"
        parts = module.split(".")
        for i, part in enumerate(parts):
            owner = _scope(parts[: i + 1])
            if _internal(part) and not _inside(importer, owner):
                out.append(f"{where}: imports {module}, internal to {owner}")
                break
        else:
            if _inside(importer, ".".join(parts[:2])):
                continue  # its own package: internals are its business
            public = set(getattr(importlib.import_module(module), "__all__", ()))
            for name in names:
                if _is_submodule(module, name):
                    if _internal(name):
                        out.append(f"{where}: imports {module}.{name}, an internal module")
                elif _internal(name):
                    out.append(f"{where}: imports internal name {module}.{name}")
                elif name not in public and (importer, module, name) not in NOT_IN_ALL_YET:
                    out.append(f"{where}: {module}.{name} is not in {module}.__all__")
    return out


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_public_names_of_other_packages(module: str) -> None:
    assert privacy_violations(module, MODULES[module]) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_init_defines_all(package: str) -> None:
    tree = ast.parse(MODULES[package].read_text("utf-8"))
    assigned = {
        t.id
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name)
    }
    assert "__all__" in assigned
    assert isinstance(importlib.import_module(package).__all__, list)


def _lazy_parts(package: str) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """``(_EXPORTS, TYPE_CHECKING imports, eager imports)`` of a package ``__init__``.

    A TYPE_CHECKING import re-exports its name for type checkers (strict ones
    included) when written ``import X as X`` or listed in a literal ``__all__``.
    """
    tree = ast.parse(MODULES[package].read_text("utf-8"))
    exports: dict[str, str] = {}
    mirror: dict[str, str] = {}
    eager: list[str] = []
    plain: set[str] = set()
    literal_all: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in targets):
                assert node.value is not None
                exports = ast.literal_eval(node.value)
            is_all = any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets)
            if is_all and isinstance(node.value, ast.List | ast.Tuple):
                literal_all = {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
        elif isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for sub in node.body:
                assert isinstance(sub, ast.ImportFrom), ast.unparse(sub)
                assert sub.module, ast.unparse(sub)
                for alias in sub.names:
                    assert alias.asname in (None, alias.name), ast.unparse(sub)
                    mirror[alias.name] = sub.module
                    if alias.asname is None:
                        plain.add(alias.name)
        elif isinstance(node, ast.ImportFrom) and _inside(node.module or "", "nexus_cache"):
            eager.append(node.module or "")
    assert plain <= literal_all, f"{package}: neither `as` nor in a literal __all__: {plain}"
    return exports, mirror, eager


LAZY = [p for p in PACKAGES if p not in NOT_LAZY_YET and p != "nexus_cache.cli"]


@pytest.mark.parametrize("package", LAZY)
def test_a_package_init_exports_lazily_with_a_type_checking_mirror(package: str) -> None:
    exports, mirror, eager = _lazy_parts(package)
    module = importlib.import_module(package)
    assert exports, f"{package}: no _EXPORTS map"
    assert mirror == exports, f"{package}: the TYPE_CHECKING imports differ from _EXPORTS"
    assert set(exports) <= set(module.__all__)
    assert [m for m in eager if (package, m) not in EAGER] == ["nexus_cache._lazy"]
    for name, home in exports.items():
        assert home in MODULES, f"{package}.{name}: no module {home}"
        assert getattr(module, name) is getattr(importlib.import_module(home), name)


def test_the_cli_package_exports_nothing() -> None:
    # the command's modules are reached through cli.main, never re-exported
    assert importlib.import_module("nexus_cache.cli").__all__ == []


# The CLI is a client of the library. Of the package-wide internals it uses
# the size grammar, the strict number parsers (one parser each, never a
# second one in the CLI), the one reader of environment variables and the
# one atomic publish path, for the files a user names (--out).
CLI_INTERNALS = {
    "nexus_cache._env",
    "nexus_cache._sizes",
    "nexus_cache._numbers",
    "nexus_cache._storage",
}


def cli_violations(importer: str, path: Path) -> list[str]:
    out = privacy_violations(importer, path)
    for line, module, _ in _imports(path):
        parts = module.split(".")
        # deeper internals are privacy violations already
        if len(parts) > 1 and _internal(parts[1]) and ".".join(parts[:2]) not in CLI_INTERNALS:
            out.append(f"{importer}:{line}: the CLI imports {module}")
    return out


@pytest.mark.parametrize("module", [m for m in sorted(MODULES) if _inside(m, "nexus_cache.cli")])
def test_the_cli_imports_public_names_and_four_internals(module: str) -> None:
    assert cli_violations(module, MODULES[module]) == []


def test_the_allowlists_name_only_what_still_needs_them() -> None:
    for package in NOT_LAZY_YET:
        exports, mirror, _ = _lazy_parts(package)
        assert not (exports and mirror == exports), f"{package} follows it: drop it from the list"
    for importer, module, name in NOT_IN_ALL_YET:
        assert name not in getattr(importlib.import_module(module), "__all__", ()), importer


def test_the_checks_catch_a_cross_package_import_of_internals(tmp_path: Path) -> None:
    bad = tmp_path / "m.py"
    bad.write_text(
        "from nexus_cache.program._catalog import describe_entries\n"
        "from nexus_cache.lakehouse import _cache\n"
        "from nexus_cache._storage._atomic import atomic_write\n"
        "from nexus_cache.device.ledger import DeviceLedger, _helper\n"
        "from nexus_cache.device.source.claim import DecodeFlight\n"
        "from nexus_cache._sizes import parse_size\n"
    )
    found = privacy_violations("nexus_cache.service.m", bad)
    assert [f.split(":")[1] for f in found] == ["1", "2", "3", "4", "5"], found
    # inside its own package a module may use the package's internals,
    # its sub-packages' included
    assert [f.split(":")[1] for f in privacy_violations("nexus_cache.program.m", bad)] == [
        "2",
        "3",
        "4",
        "5",
    ]
    assert privacy_violations("nexus_cache.device.m", bad)[-1].split(":")[1] == "3"
    found = cli_violations("nexus_cache.cli.m", bad)
    assert [f.split(":")[1] for f in found] == ["1", "2", "3", "4", "5"], found


def test_the_checks_catch_what_the_cli_must_not_import(tmp_path: Path) -> None:
    bad = tmp_path / "probe.py"
    bad.write_text(
        "from nexus_cache.program._paths import default_sqlite_path\n"
        "from nexus_cache.lakehouse import _not_there\n"
        "import nexus_cache.device._figures\n"
        "from nexus_cache.lakehouse import ENV_ROOT_IS_NOT_EXPORTED\n"
        "from nexus_cache._lazy import lazy_exports\n"
        "from nexus_cache._sizes import parse_size\n"
    )
    found = cli_violations("nexus_cache.cli.probe", bad)
    assert "imports nexus_cache.program._paths, internal to nexus_cache.program" in found[0]
    assert "internal name nexus_cache.lakehouse._not_there" in found[1]
    assert "imports nexus_cache.device._figures, internal to nexus_cache.device" in found[2]
    assert "not in nexus_cache.lakehouse.__all__" in found[3]
    assert found[4].endswith("the CLI imports nexus_cache._lazy")
    assert len(found) == 5, found
