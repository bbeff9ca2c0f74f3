"""Every name the user docs tell a reader to import, or spell as a dotted
``nexus_cache`` path, imports as written."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# a made-up algorithm in docs/graph.md's "Adding an algorithm"
PLACEHOLDERS = {"nexus_cache.graph.mine"}
_FROM = re.compile(r"from (nexus_cache[\w.]*) import \(?([\w, \n]+?)\)?(?=\n\n|\n\S|$|  #)")
_DOTTED = re.compile(r"`(nexus_cache(?:\.\w+)+)`")


def _resolve(path: str) -> Any:
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[i:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(path)


def _names(doc: Path) -> list[str]:
    text = doc.read_text("utf-8")
    names = []
    for match in _FROM.finditer(text):
        for name in match.group(2).replace("\n", " ").split(","):
            if name.strip():
                names.append(f"{match.group(1)}.{name.split(' as ')[0].strip()}")
    names += _DOTTED.findall(text)
    return sorted(set(names) - PLACEHOLDERS)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_documented_name_imports(doc: Path) -> None:
    missing = []
    for name in _names(doc):
        try:
            _resolve(name)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{name}: {exc}")
    assert missing == []


def test_the_scan_finds_the_imports_of_the_docs() -> None:
    names = _names(ROOT / "docs" / "service.md")
    assert "nexus_cache.service.GraphQuery" in names
    assert "nexus_cache.service.QueryService" in names
