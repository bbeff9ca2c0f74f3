"""Per-device settings: the cache cap and the managed capacity."""

from __future__ import annotations

from dataclasses import dataclass

from nexus_cache.errors import ConfigError

__all__ = ["MANAGED_CAPACITY_FRACTION", "DeviceProfile"]

#: Share of a device's total memory the ledger manages when a profile names
#: no managed capacity; the rest is left to the driver, CUDA context and
#: libraries that allocate outside our domains.
MANAGED_CAPACITY_FRACTION = 0.9


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class DeviceProfile:
    """Settings of one device. Immutable; validated on construction.

    ``cache_cap_bytes`` is a ceiling on resident cache bytes, never an eager
    reservation; 0 disables the GPU caches on the device. A None
    ``managed_capacity_bytes`` means :data:`MANAGED_CAPACITY_FRACTION` of the
    device's total memory.
    """

    device_id: int
    cache_cap_bytes: int
    managed_capacity_bytes: int | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.device_id) or self.device_id < 0:
            raise ConfigError(f"DeviceProfile.device_id={self.device_id!r}; accepted: an int >= 0")
        if not _is_int(self.cache_cap_bytes) or self.cache_cap_bytes < 0:
            raise ConfigError(
                f"DeviceProfile.cache_cap_bytes={self.cache_cap_bytes!r} on device "
                f"{self.device_id}; accepted: an int >= 0 (0 disables the GPU caches)"
            )
        managed = self.managed_capacity_bytes
        if managed is not None:
            if not _is_int(managed) or managed <= 0:
                raise ConfigError(
                    f"DeviceProfile.managed_capacity_bytes={managed!r} on device "
                    f"{self.device_id}; accepted: an int > 0, or None for "
                    f"{MANAGED_CAPACITY_FRACTION:.0%} of the device's memory"
                )
            if self.cache_cap_bytes > managed:
                raise ConfigError(
                    f"DeviceProfile.cache_cap_bytes={self.cache_cap_bytes} exceeds "
                    f"managed_capacity_bytes={managed} on device {self.device_id}; lower the cap"
                )

    def resolve_managed_capacity(self, device_total_bytes: int) -> int:
        """The managed capacity on a device of ``device_total_bytes``; checks it fits."""
        managed = self.managed_capacity_bytes
        if managed is None:
            managed = int(device_total_bytes * MANAGED_CAPACITY_FRACTION)
        elif managed > device_total_bytes:
            raise ConfigError(
                f"DeviceProfile.managed_capacity_bytes={managed} exceeds the "
                f"{device_total_bytes} B of device {self.device_id}; lower it or pass None"
            )
        if self.cache_cap_bytes > managed:
            raise ConfigError(
                f"DeviceProfile.cache_cap_bytes={self.cache_cap_bytes} exceeds the managed "
                f"capacity {managed} B of device {self.device_id} "
                f"({MANAGED_CAPACITY_FRACTION:.0%} of {device_total_bytes} B); lower the cap"
            )
        return managed
