"""Public module paths that moved in the device and service packages still import,
with a DeprecationWarning that names the new path (docs/architecture.md:
a module without an underscore may be imported directly)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# old public module -> where its names live now
MOVED = {
    "nexus_cache.device.graph_cache": "nexus_cache.device.graph.cache",
    "nexus_cache.device.graph_key": "nexus_cache.device.graph.key",
    "nexus_cache.device.source_cache": "nexus_cache.device.source.cache",
    "nexus_cache.device.source_claim": "nexus_cache.device.source.claim",
    "nexus_cache.device.source_events": "nexus_cache.device.source.events",
    "nexus_cache.device.source_key": "nexus_cache.device.source.key",
}

_PROBE = """
import importlib, json, sys, warnings
old, new = sys.argv[1], sys.argv[2]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    module = importlib.import_module(old)
target = importlib.import_module(new)
print(json.dumps({
    "all": sorted(module.__all__),
    "same": all(getattr(module, n) is getattr(target, n) for n in module.__all__),
    "target_all": sorted(target.__all__),
    "warnings": [str(w.message) for w in caught if w.category is DeprecationWarning],
}))
"""


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_moved_public_module_still_imports_and_warns(old: str) -> None:
    new = MOVED[old]
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, old, new], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["all"] == found["target_all"]
    assert found["same"]
    assert len(found["warnings"]) == 1
    assert old in found["warnings"][0]
    assert new in found["warnings"][0]


_OLD_NAME = """
import json, warnings
from nexus_cache.service import queries
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    old = queries.Graph
print(json.dumps({
    "same": old is queries.GraphQuery,
    "warnings": [str(w.message) for w in caught if w.category is DeprecationWarning],
}))
"""


def test_the_old_query_class_name_imports_from_the_queries_module() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _OLD_NAME], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["same"]
    assert len(found["warnings"]) == 1
    assert "GraphQuery" in found["warnings"][0]
