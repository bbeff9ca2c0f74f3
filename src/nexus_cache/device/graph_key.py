"""Deprecated path of :mod:`nexus_cache.device.graph.key`, where these names moved.

Import them from there or from :mod:`nexus_cache.device`; importing this
module warns (``DeprecationWarning``) once per process.
"""

from __future__ import annotations

from nexus_cache.device._moved import warn_moved
from nexus_cache.device.graph.key import (
    ALGORITHMS,
    GraphPlan,
    GraphUncachedReason,
    ResidentGraphKey,
    plan_graph_run,
)

__all__ = ["ALGORITHMS", "GraphPlan", "GraphUncachedReason", "ResidentGraphKey", "plan_graph_run"]

warn_moved(__name__, "nexus_cache.device.graph.key")
