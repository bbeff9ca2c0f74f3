"""The graph algorithm docs a user reads match the registry and the command line:
docs/service.md's algorithm table and command synopsis, README's list."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from nexus_cache.cli.main import build_parser
from nexus_cache.graph.registry import ALGORITHMS, AlgorithmSpec

ROOT = Path(__file__).resolve().parents[2]
SERVICE = (ROOT / "docs" / "service.md").read_text("utf-8")
README = (ROOT / "README.md").read_text("utf-8")


def _algorithm_rows() -> dict[str, str]:
    """Algorithm name -> the params cell of its row in service.md's table."""
    table = SERVICE[SERVICE.index("| `algorithm` | `params` (default) |") :]
    rows: dict[str, str] = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        names, params = line.split("|")[1:3]
        for name in re.findall(r"`(\w+)`", names):
            rows[name] = params
    return rows


def _documented_default(cell: str, name: str) -> str | None:
    match = re.search(rf"`{name}` \(([^);]+)", cell)
    return None if match is None else match.group(1).strip("` ")


@pytest.mark.parametrize("spec", ALGORITHMS.values(), ids=lambda s: s.name)
def test_the_service_table_lists_each_algorithm_with_its_parameters_and_defaults(
    spec: AlgorithmSpec,
) -> None:
    rows = _algorithm_rows()
    assert spec.name in rows
    cell = rows[spec.name]
    if not spec.params:
        assert cell.strip().startswith("none")
    for param in spec.params:
        documented = _documented_default(cell, param.name)
        assert documented is not None, f"{spec.name}: `{param.name}` not in {cell!r}"
        if param.required:
            assert documented == "required"
        elif param.default is None:
            assert documented == "none"
        elif param.kind == "choice":
            assert documented == param.default
        else:
            assert float(documented) == param.default


def test_the_service_table_lists_no_other_algorithm() -> None:
    assert set(_algorithm_rows()) == set(ALGORITHMS)


def _command_parser(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = commands.choices[command]
    return found


def _synopsis(command: str) -> str:
    block = SERVICE[SERVICE.index("## Command line") :]
    block = block[block.index("```") + 3 :]
    block = block[: block.index("```")]
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"nexus-cache {command} "))
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].startswith("nexus-cache ")),
        len(lines),
    )
    return "\n".join(lines[start:end])


@pytest.mark.parametrize("command", ["scan", "graph"])
def test_the_synopsis_names_every_option_and_choice(command: str) -> None:
    synopsis = _synopsis(command)
    if command == "graph":
        assert "|".join(ALGORITHMS) in synopsis
    for action in _command_parser(command)._actions:
        flags = [f for f in action.option_strings if f.startswith("--") and f != "--help"]
        for flag in flags:
            assert re.search(rf"{re.escape(flag)}\b", synopsis), f"{flag} not in the synopsis"
        if flags and action.choices:
            assert f"{flags[0]} {'|'.join(action.choices)}" in synopsis


def test_the_readme_lists_every_algorithm() -> None:
    listed = README[README.index("`nexus-cache graph --help` lists every algorithm") :]
    listed = listed[: listed.index("flags.")]
    assert re.findall(r"`(\w+)`", listed) == list(ALGORITHMS)
