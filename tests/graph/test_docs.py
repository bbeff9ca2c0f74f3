"""docs/graph.md states the GraphOptions fields, defaults and BFS switch points of the code."""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

from nexus_cache.graph import DEFAULT_MAX_TEMP_BYTES, GraphOptions

DOC = (Path(__file__).resolve().parents[2] / "docs" / "graph.md").read_text()


def test_options_table_matches_graph_options() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `([^`]+)` \|", DOC, re.MULTILINE)
    documented = {name: default for name, default in rows}
    fields = {f.name: f.default for f in dataclasses.fields(GraphOptions)}
    assert documented.keys() == fields.keys()
    for name, default in fields.items():
        assert documented[name] == (f'"{default}"' if isinstance(default, str) else str(default))


def test_bfs_switch_points_and_memory_bound_are_the_code_s() -> None:
    bfs_module = importlib.import_module("nexus_cache.graph.traversal")
    similarity = importlib.import_module("nexus_cache.graph.similarities")
    assert f"1/{bfs_module._ALPHA} of the unexplored arcs" in DOC
    assert f"fewer than 1/{bfs_module._BETA} of the vertices" in DOC
    assert f"max_temp_bytes / {similarity._BYTES_PER_ELEMENT}" in DOC
    assert DEFAULT_MAX_TEMP_BYTES == 256 << 20
    assert 'max_temp_bytes="256M"' in DOC


def test_every_uncached_reason_is_documented() -> None:
    from nexus_cache.device import GraphUncachedReason

    documented = set(re.findall(r"^\| `(\w+)` \| ", DOC, re.MULTILINE))
    assert {r.value for r in GraphUncachedReason} <= documented


def test_build_estimate_in_the_troubleshooting_is_the_code_s() -> None:
    memory = importlib.import_module("nexus_cache.graph.memory")
    text = re.sub(r"\s+", " ", DOC)
    per_edge, per_arc = memory._BUILD_PER_EDGE, memory._BUILD_PER_ARC
    assert f"about {per_edge} B per input edge plus {per_arc} B per stored arc" in text
