"""Deprecated path of :mod:`nexus_cache.device.source.claim`, where these names moved.

Import them from there or from :mod:`nexus_cache.device`; importing this
module warns (``DeprecationWarning``) once per process.
"""

from __future__ import annotations

from nexus_cache.device._moved import warn_moved
from nexus_cache.device.source.claim import LEADER_LOCAL_ERRORS, ClaimOutcomes, SourceClaim

__all__ = ["LEADER_LOCAL_ERRORS", "ClaimOutcomes", "SourceClaim"]

warn_moved(__name__, "nexus_cache.device.source.claim")
