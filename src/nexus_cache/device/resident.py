"""``DeviceResidentCaches``: the GPU-resident caches the query service owns."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from nexus_cache._numbers import check_timeout
from nexus_cache.backends import BACKEND_NAMES, DeviceBackend, select_backend
from nexus_cache.device.domain import DeviceCacheAllocationFactory
from nexus_cache.device.graph import GraphCacheSubdomain
from nexus_cache.device.ledger import DeviceLedger
from nexus_cache.device.metrics import DeviceCacheCollector, gauge_snapshot, register_prometheus
from nexus_cache.device.profile import DeviceProfile
from nexus_cache.device.report import DeviceCacheReport
from nexus_cache.device.source.cache import SourceCacheSubdomain
from nexus_cache.device.source.events import SourceEventSnapshot
from nexus_cache.device.subdomain import DrainResult
from nexus_cache.errors import ConfigError, LifecycleError

__all__ = ["DeviceResidentCaches", "DeviceShutdown"]


@dataclass(frozen=True)
class DeviceShutdown:
    """How one device's shutdown went; ``complete`` when the domain was released."""

    device_id: int
    graph: DrainResult | None
    source: DrainResult | None
    domain_released: bool
    problem: str | None = None

    @property
    def complete(self) -> bool:
        return self.problem is None


@dataclass
class _Device:
    profile: DeviceProfile
    ledger: DeviceLedger
    factory: DeviceCacheAllocationFactory | None = None
    source: SourceCacheSubdomain | None = None
    graph: GraphCacheSubdomain | None = None


class DeviceResidentCaches:
    """Per device: a ledger; with ``cache_cap_bytes > 0`` also one allocation
    factory, its one domain, and the source and graph subdomains sharing it.

    Thread-safe. ``backend`` is a :class:`DeviceBackend`, a backend name, or
    None for ``NEXUS_DEVICE_BACKEND``. :meth:`shutdown` is idempotent.
    """

    def __init__(
        self, profiles: Iterable[DeviceProfile], backend: DeviceBackend | str | None = None
    ) -> None:
        if backend is None or isinstance(backend, str):
            backend = select_backend(backend)
        elif not isinstance(backend, DeviceBackend):
            names = ", ".join(repr(name) for name in BACKEND_NAMES)
            raise ConfigError(f"backend={backend!r}; accepted: a DeviceBackend, {names} or None")
        self._backend = backend
        profiles = tuple(profiles)
        if not profiles:
            raise ConfigError("DeviceResidentCaches needs at least one DeviceProfile")
        capacities: dict[int, int] = {}
        for profile in profiles:
            if not isinstance(profile, DeviceProfile):
                raise ConfigError(f"profiles must be DeviceProfile objects, got {profile!r}")
            if profile.device_id in capacities:
                raise ConfigError(f"device {profile.device_id} has more than one DeviceProfile")
            backend.check_device(profile.device_id)
            total = backend.mem_info(profile.device_id).total_bytes
            capacities[profile.device_id] = profile.resolve_managed_capacity(total)
        self._devices: dict[int, _Device] = {}
        try:
            for profile in profiles:
                self._install(profile, capacities[profile.device_id])
        except BaseException:
            for device in self._devices.values():
                if device.factory is not None:
                    device.factory.release()
            raise
        self._shutdown_lock = threading.Lock()
        self._shutdown: list[DeviceShutdown] | None = None

    def _install(self, profile: DeviceProfile, capacity: int) -> None:
        ledger = DeviceLedger(profile.device_id, capacity, profile.cache_cap_bytes)
        device = _Device(profile, ledger)
        self._devices[profile.device_id] = device
        if profile.cache_cap_bytes > 0:
            device.factory = DeviceCacheAllocationFactory(
                self._backend, profile.device_id, limit_bytes=profile.cache_cap_bytes
            )
            device.source = SourceCacheSubdomain(ledger, device.factory)
            device.graph = GraphCacheSubdomain(ledger, device.factory)

    def __repr__(self) -> str:
        return f"DeviceResidentCaches({self._backend.name}, devices={sorted(self._devices)})"

    # -- access --------------------------------------------------------------------------

    @property
    def backend(self) -> DeviceBackend:
        return self._backend

    @property
    def device_ids(self) -> list[int]:
        return sorted(self._devices)

    @property
    def closed(self) -> bool:
        return self._shutdown is not None

    def profile(self, device_id: int) -> DeviceProfile:
        return self._device(device_id).profile

    def ledger(self, device_id: int) -> DeviceLedger:
        return self._device(device_id).ledger

    def ledgers(self) -> list[DeviceLedger]:
        return [self._devices[d].ledger for d in sorted(self._devices)]

    def factory(self, device_id: int) -> DeviceCacheAllocationFactory | None:
        """The device's allocation-domain owner; None when its cap is 0."""
        return self._device(device_id).factory

    def source_cache(self, device_id: int) -> SourceCacheSubdomain | None:
        return self._device(device_id).source

    def graph_cache(self, device_id: int) -> GraphCacheSubdomain | None:
        return self._device(device_id).graph

    def _device(self, device_id: int) -> _Device:
        device = self._devices.get(device_id)
        if device is None:
            raise ConfigError(
                f"device {device_id!r} has no profile here; profiled devices: {self.device_ids}"
            )
        return device

    def grant_ceiling(self, device_id: int) -> int:
        """The largest grant ``device_id`` could admit without a shutdown: its managed
        capacity less the cache bytes no grant release and no eviction frees (parked
        graphs, which are never evicted, and quarantined entries).

        A moment's figure: graphs parked or retired later move it.
        """
        device = self._device(device_id)
        snap = device.ledger.snapshot()
        kept = snap.cache_quarantined_bytes
        if device.graph is not None:
            kept += device.graph.resident_bytes()
        return max(0, snap.managed_capacity_bytes - kept)

    # -- observability ---------------------------------------------------------------------

    def device_cache_reports(self) -> list[DeviceCacheReport]:
        """Ledger values paired with physical domain usage and activity, per device.

        For diagnosing allocator drift, not for admission decisions.
        """
        reports = []
        for device_id in self.device_ids:
            device = self._devices[device_id]
            factory = device.factory
            reports.append(
                DeviceCacheReport(
                    device_id=device_id,
                    backend=self._backend.name,
                    ledger=device.ledger.snapshot(),
                    device_memory=self._backend.mem_info(device_id),
                    domain=None if factory is None else factory.counters(),
                    domain_released=None if factory is None else factory.released,
                    source=None if device.source is None else device.source.stats(),
                    graph=None if device.graph is None else device.graph.stats(),
                )
            )
        return reports

    def device_cache_source_event_snapshots(self) -> list[SourceEventSnapshot]:
        """Per device with caches installed: the last ``SOURCE_EVENT_LIMIT``
        fingerprinted load and promotion events of its source cache, with its
        hits, misses, waits, leader retries, skipped retentions and evictions.

        Keys appear only as fingerprints; errors only by class name.
        """
        return [
            device.source.event_snapshot()
            for device in (self._devices[d] for d in self.device_ids)
            if device.source is not None
        ]

    def gauge_snapshot(self) -> dict[str, dict[int, int]]:
        """``{gauge name: {device: bytes}}`` for the two ledger gauges."""
        return gauge_snapshot(self.ledgers())

    def register_prometheus(self, registry: Any = None) -> DeviceCacheCollector:
        """Export the two gauges on ``registry`` (default: prometheus-client's global one)."""
        return register_prometheus(self.ledgers, registry)

    # -- shutdown ----------------------------------------------------------------------------

    def shutdown(self, timeout: float = 10.0) -> list[DeviceShutdown]:
        """Close admission, drain graph entries, then source entries, then release
        each allocation-domain owner.

        Idempotent: once every device completed, later calls return the same
        result; after an incomplete shutdown (pins held past ``timeout``,
        builders still running, unsafe teardowns) the domain is kept and a
        later call retries. ``timeout`` must be a finite number of seconds >= 0
        (:class:`ConfigError`, before anything is shut).
        """
        timeout = check_timeout("shutdown timeout", timeout)
        with self._shutdown_lock:
            if self._shutdown is not None and all(d.complete for d in self._shutdown):
                return self._shutdown
            deadline = time.monotonic() + timeout
            for device in self._devices.values():
                device.ledger.close_admission("the device caches were shut down")
                for sub in (device.graph, device.source):
                    if sub is not None:
                        sub.close()
            results = [self._shutdown_device(self._devices[d], deadline) for d in self.device_ids]
            self._shutdown = results
            return results

    def _shutdown_device(self, device: _Device, deadline: float) -> DeviceShutdown:
        if device.factory is None or device.graph is None or device.source is None:
            return DeviceShutdown(device.profile.device_id, None, None, False)
        graph = device.graph.drain(max(0.0, deadline - time.monotonic()))
        source = device.source.drain(max(0.0, deadline - time.monotonic()))
        problem = None
        if not (graph.complete and source.complete):
            problem = (
                "allocation domain kept: "
                f"graph {graph.still_pinned} pinned / {graph.in_flight} in flight / "
                f"{graph.quarantined} quarantined, source {source.still_pinned} pinned / "
                f"{source.in_flight} in flight / {source.quarantined} quarantined"
            )
        else:
            try:
                device.factory.release()
            except LifecycleError as exc:
                problem = f"allocation domain kept: {exc}"
        return DeviceShutdown(
            device.profile.device_id, graph, source, device.factory.released, problem
        )

    def __enter__(self) -> DeviceResidentCaches:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()
