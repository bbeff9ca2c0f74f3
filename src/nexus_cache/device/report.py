"""``device_cache_reports()`` rows: ledger figures beside physical domain usage.

The ledger decides; the domain only measures. A report puts both side by
side so allocator drift is visible (``drift_bytes`` > 0: the domain holds
live bytes no ledger charge covers). Do not make admission decisions from
the physical columns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nexus_cache.backends import DomainCounters, MemoryInfo
from nexus_cache.device.ledger import LedgerSnapshot
from nexus_cache.device.subdomain import SubdomainStats

__all__ = ["REPORT_COLUMNS", "DeviceCacheReport", "format_tsv"]


def _names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


_STATS_FIELDS = [name for name in _names(SubdomainStats) if name != "kind"]

#: Column order of :meth:`DeviceCacheReport.to_dict` and of the TSV.
REPORT_COLUMNS: tuple[str, ...] = (
    "device_id",
    "backend",
    "caches_installed",
    *[name for name in _names(LedgerSnapshot) if name != "device_id"],
    "device_free_bytes",
    "device_total_bytes",
    "domain_released",
    *[f"domain_{name}" for name in _names(DomainCounters)],
    "drift_bytes",
    *[f"source_{name}" for name in _STATS_FIELDS],
    *[f"graph_{name}" for name in _STATS_FIELDS],
)


@dataclass(frozen=True)
class DeviceCacheReport:
    """One device: ledger snapshot, device memory, domain counters, subdomain stats."""

    device_id: int
    backend: str
    ledger: LedgerSnapshot
    device_memory: MemoryInfo
    domain: DomainCounters | None = None
    domain_released: bool | None = None
    source: SubdomainStats | None = None
    graph: SubdomainStats | None = None

    @property
    def caches_installed(self) -> bool:
        return self.domain is not None

    @property
    def drift_bytes(self) -> int | None:
        """Live domain bytes minus the ledger's cache charge (None without a domain).

        Negative while reservations are being filled; positive means bytes
        live in the domain that no charge covers.
        """
        if self.domain is None:
            return None
        return self.domain.used_bytes - self.ledger.cache_charged_bytes

    def to_dict(self) -> dict[str, Any]:
        """A flat row in :data:`REPORT_COLUMNS` order; absent parts are None."""
        row: dict[str, Any] = dict.fromkeys(REPORT_COLUMNS)
        row.update(self.ledger.to_dict())
        row.update(
            device_id=self.device_id,
            backend=self.backend,
            caches_installed=self.caches_installed,
            device_free_bytes=self.device_memory.free_bytes,
            device_total_bytes=self.device_memory.total_bytes,
            domain_released=self.domain_released,
            drift_bytes=self.drift_bytes,
        )
        if self.domain is not None:
            row.update({f"domain_{k}": v for k, v in dataclasses.asdict(self.domain).items()})
        for prefix, stats in (("source", self.source), ("graph", self.graph)):
            if stats is not None:
                row.update({f"{prefix}_{k}": getattr(stats, k) for k in _STATS_FIELDS})
        return row


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).replace("\t", " ").replace("\n", " ")


def format_tsv(reports: Iterable[DeviceCacheReport | Mapping[str, Any]]) -> str:
    """Header plus one line per device; empty cells where a part is absent.

    A report may also be given as its ``to_dict()`` form (what a server sends).
    """
    lines = ["\t".join(REPORT_COLUMNS)]
    for report in reports:
        row = report if isinstance(report, Mapping) else report.to_dict()
        lines.append("\t".join(_cell(row[name]) for name in REPORT_COLUMNS))
    return "\n".join(lines) + "\n"
