"""The user docs: complete configuration reference, no internal-process text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
USER_DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md"))]
_VARIABLE = re.compile(r"""["'](NEXUS_[A-Z0-9_]*[A-Z0-9])["']""")


def variables_in_source() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "src" / "nexus_cache").rglob("*.py"):
        found.update(_VARIABLE.findall(path.read_text("utf-8")))
    return found


def test_every_environment_variable_is_in_the_configuration_reference() -> None:
    reference = (ROOT / "docs" / "configuration.md").read_text("utf-8")
    variables = variables_in_source()
    assert "NEXUS_LAKEHOUSE_CACHE_ROOT" in variables  # the scan finds them at all
    missing = sorted(v for v in variables if f"`{v}`" not in reference)
    assert missing == [], f"document these in docs/configuration.md: {missing}"


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.name)
def test_docs_speak_to_users(doc: Path) -> None:
    text = doc.read_text("utf-8")
    problems = [
        pattern
        for pattern in (
            r"\bthe peers?\b",
            r"\bseed\b",
            r"\bthe helpers\b",  # the team, not code ("output helpers" is fine)
            r"DESIGN\.md",
            r"/work/",
            r"`(?=[0-9]*[a-f])[0-9a-f]{7,40}`",  # commit hashes
            r"\bat (?=[0-9]*[a-f])[0-9a-f]{7,40}\b",
        )
        if re.search(pattern, text, re.IGNORECASE)
    ]
    assert problems == []


def test_readme_starts_with_the_two_setup_commands_and_ci_runs_the_second() -> None:
    readme = (ROOT / "README.md").read_text("utf-8").splitlines()
    block = readme[readme.index("```bash") + 1 : readme.index("```bash") + 3]
    assert block[0].endswith("pip install -q -e '.[cuda,host]' && .venv/bin/nexus-cache demo")
    assert block[1].endswith("pip install -q -e '.[test]' && .venv/bin/python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text("utf-8").splitlines()
    assert block[1] in ci  # the README's test command, exactly, then the static checks
    checks = ci[ci.index(block[1]) + 1 :]
    assert checks == [
        ".venv/bin/ruff check .",
        ".venv/bin/ruff format --check .",
        ".venv/bin/mypy src/nexus_cache",
    ]
