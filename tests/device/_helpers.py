"""Shared builders for the device tests (host backend, small simulated devices)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from nexus_cache.backends import HostBackend
from nexus_cache.device import CacheSubdomain, DeviceProfile, DeviceResidentCaches, ResidentEntry

KIB = 1024
MIB = 1024 * KIB


class FailingStream:
    """A stream whose synchronize fails, as a faulted CUDA stream would."""

    def __init__(self) -> None:
        self.calls = 0

    def synchronize(self) -> None:
        self.calls += 1
        raise RuntimeError("cudaErrorLaunchFailure (injected)")


class CountingStream:
    def __init__(self) -> None:
        self.calls = 0

    def synchronize(self) -> None:
        self.calls += 1


def make_caches(
    cap: int = 64 * KIB,
    capacity: int | None = 128 * KIB,
    total: int = 1 * MIB,
    devices: int = 1,
) -> DeviceResidentCaches:
    backend = HostBackend(device_total_bytes=total, device_count=devices)
    profiles = [DeviceProfile(d, cap, capacity) for d in range(devices)]
    return DeviceResidentCaches(profiles, backend=backend)


def fill(
    sub: CacheSubdomain,
    key: Hashable,
    nbytes: int,
    *,
    reserve: int | None = None,
    publish: bool = True,
) -> ResidentEntry:
    """Reserve, allocate ``nbytes`` in the domain, attach, and (by default) publish."""
    entry = sub.reserve(key, nbytes if reserve is None else reserve)
    array = sub.factory.domain.empty(nbytes, np.uint8)
    array[:] = 7
    entry.attach({"column": array}, [array])
    del array
    if publish:
        return sub.publish(entry)
    return entry


class InterruptedCopy:
    """A device value whose copy into any domain but ``attempt`` allocates there and
    is then interrupted, as Ctrl-C arriving during the copy would."""

    def __init__(self, inner: Any, attempt: Any) -> None:
        self.inner = inner
        self.attempt = attempt

    @property
    def nbytes(self) -> int:
        return int(self.inner.nbytes)

    def copy_into(self, domain: Any) -> Any:
        copy = self.inner.copy_into(domain)
        if domain is not self.attempt:
            del copy
            raise KeyboardInterrupt
        return copy

    def device_arrays(self) -> tuple[Any, ...]:
        return tuple(self.inner.device_arrays())
