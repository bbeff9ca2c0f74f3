"""The service's one door to the decoded-source cache.

``SourcePort.load`` returns the decoded table of a scan and how the cache
answered: ``hit``, ``miss-led`` (this attempt decoded and offered the frame to
the cache), ``miss-followed`` (it waited for another attempt's decode),
``bypass`` with a reason, or ``unavailable`` when this build has no
single-flight source cache to use (the scan is then decoded uncached).

Bypass reasons: ``cache_cap_bytes=0`` on the device, ``no proven identity``
for an object (the lakehouse could not prove what it contains), and
``synthetic count source`` for :class:`~nexus_cache.service.Count`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from nexus_cache.device import DeviceResidentCaches
from nexus_cache.service._lake import SourcePlan

__all__ = ["SourceOutcome", "SourcePort"]


@dataclasses.dataclass(frozen=True)
class SourceOutcome:
    """How the decoded-source cache answered one load."""

    status: str
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason}


BYPASS_COUNT = SourceOutcome("bypass", "synthetic count source")


class SourcePort:
    """Loads scans through the source cache of a device, where one exists. Thread-safe."""

    def __init__(self, caches: DeviceResidentCaches) -> None:
        self._caches = caches

    def load(
        self,
        device_id: int,
        plan: SourcePlan,
        columns: Sequence[str] | None,
        batch_rows: int,
        decode: Callable[[], pa.Table],
    ) -> tuple[pa.Table, SourceOutcome]:
        """The scan's table, decoded by ``decode`` unless the cache serves it."""
        subdomain = self._caches.source_cache(device_id)
        if subdomain is None:
            return decode(), SourceOutcome("bypass", "cache_cap_bytes=0")
        if plan.identity_keys is None:
            return decode(), SourceOutcome("bypass", "no proven identity")
        if not hasattr(subdomain, "checkout_or_claim"):
            return decode(), SourceOutcome(
                "unavailable", "this build has no single-flight source cache"
            )
        raise NotImplementedError  # replaced when the source cache lands
