"""``nexus-cache graph --help`` says each algorithm's default orientation unambiguously."""

from __future__ import annotations

import pytest

from nexus_cache.cli.main import main
from nexus_cache.graph.registry import ALGORITHMS


def _help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(["graph", "--help"])
    assert exc.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_the_orientation_defaults_read_as_two_clauses(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys)
    directed = [n for n, s in ALGORITHMS.items() if s.directed]
    undirected = [n for n, s in ALGORITHMS.items() if not s.directed]
    # "... default to --directed; jaccard, ... to --undirected", never
    # "--directed, jaccard", which reads as a list of what they default to
    assert f"{directed[-1]} default to --directed; {undirected[0]}" in text
    assert f"{undirected[-1]} to --undirected" in text


def test_the_help_says_which_algorithms_refuse_directed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    only = [n for n, s in ALGORITHMS.items() if s.undirected_only]
    assert only == ["triangles"]
    assert "(triangles refuses --directed)" in _help(capsys)
