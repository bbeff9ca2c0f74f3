"""CUDA backend: CuPy arrays in a dedicated allocation domain per device.

CuPy (and RMM) are imported when the backend is constructed, never at module
import, so ``import nexus_cache`` works without them. A domain is either

* an **RMM** stack (``backends/rmm.py``): a pool under a limiting adaptor at
  the domain's limit, under a statistics adaptor, when RMM is installed; or
* a dedicated ``cupy.cuda.MemoryPool`` (:class:`CudaAllocationDomain`).

``NEXUS_DEVICE_ALLOCATOR`` (``auto``, ``rmm``, ``cupy``) chooses; ``auto``
takes RMM when it imports. Either way allocations are routed into the domain
with ``cupy.cuda.using_allocator`` (thread-local, so other threads keep
CuPy's default pool), every CuPy call runs under ``cupy.cuda.Device(id)`` of
the domain's device, and sizes are rounded to 512 bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any

from nexus_cache.backends._choice import choose
from nexus_cache.backends.base import DeviceBackend, MemoryInfo
from nexus_cache.backends.cupy_domain import CupyArrayDomain
from nexus_cache.backends.kinds import (
    ALLOCATOR_VARIABLE,
    CUDA,
    CUPY_POOL,
    ENV_DEVICE_ALLOCATOR,
    ENV_DEVICE_BACKEND,
    HOST,
    RMM,
)
from nexus_cache.errors import BackendUnavailableError

__all__ = ["CudaAllocationDomain", "CudaBackend"]


def _allocator_setting(name: str | None) -> str:
    """The validated allocator choice (``auto``, ``rmm`` or ``cupy``)."""
    return choose(name, variable=ALLOCATOR_VARIABLE, argument="allocator")


def _resolve_allocator(choice: str) -> str:
    """The allocator ``choice`` (a validated setting) builds on: ``auto`` takes RMM
    when it imports."""
    if choice == CUPY_POOL.name:
        return CUPY_POOL.name
    from nexus_cache.backends.rmm import rmm_available

    if rmm_available():
        return RMM.name
    if choice == RMM.name:
        raise BackendUnavailableError(
            "the rmm domain allocator was asked for but RMM does not import; install "
            f"nexus-cache[rmm] (rmm-cu13) or set {ENV_DEVICE_ALLOCATOR}={CUPY_POOL.name}"
        )
    return CUPY_POOL.name


def _import_cupy() -> Any:
    unavailable = f"set {ENV_DEVICE_BACKEND}={HOST.name}"
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        raise BackendUnavailableError(
            f"the {CUDA.name} device backend needs CuPy ({exc}); install nexus-cache[gpu] "
            f"or {unavailable}"
        ) from exc
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        raise BackendUnavailableError(
            f"the {CUDA.name} device backend found no usable GPU ({exc}); {unavailable}"
        ) from exc
    if count < 1:
        raise BackendUnavailableError(
            f"the {CUDA.name} device backend found no GPU; {unavailable}"
        )
    return cupy


class CudaBackend(DeviceBackend):
    """CuPy backend over the visible CUDA devices. Thread-safe.

    Raises :class:`BackendUnavailableError` when CuPy or a GPU is missing.
    """

    kind = CUDA

    def __init__(self, allocator: str | None = None) -> None:
        """``allocator``: ``auto``, ``rmm`` or ``cupy``; None reads ``NEXUS_DEVICE_ALLOCATOR``."""
        choice = _allocator_setting(allocator)  # a bad setting is reported first
        self._cp = _import_cupy()
        self._count = int(self._cp.cuda.runtime.getDeviceCount())
        self._allocator = _resolve_allocator(choice)

    @property
    def allocator(self) -> str:
        """``rmm`` or ``cupy``: what each new domain is built on."""
        return self._allocator

    @property
    def xp(self) -> Any:
        return self._cp

    @property
    def sparse(self) -> Any:
        import cupyx.scipy.sparse

        return cupyx.scipy.sparse

    def device_count(self) -> int:
        return self._count

    def mem_info(self, device_id: int) -> MemoryInfo:
        self.check_device(device_id)
        with self._cp.cuda.Device(device_id):
            free, total = self._cp.cuda.runtime.memGetInfo()
        return MemoryInfo(int(free), int(total))

    def create_domain(self, device_id: int, *, limit_bytes: int | None = None) -> CupyArrayDomain:
        self.check_device(device_id)
        if self._allocator == RMM.name:
            from nexus_cache.backends.rmm import RmmAllocationDomain

            return RmmAllocationDomain(self._cp, device_id, limit_bytes=limit_bytes)
        return CudaAllocationDomain(self._cp, device_id, limit_bytes=limit_bytes)

    def device_scope(self, device_id: int) -> AbstractContextManager[Any]:
        self.check_device(device_id)
        return self._cp.cuda.Device(device_id)

    def synchronize(self, device_id: int, streams: Iterable[Any] = ()) -> None:
        self.check_device(device_id)
        streams = list(streams)
        device = self._cp.cuda.Device(device_id)
        with device:
            if not streams:
                # Nothing recorded: only a whole-device sync proves the memory idle.
                device.synchronize()
            for stream in streams:
                stream.synchronize()


class CudaAllocationDomain(CupyArrayDomain):
    """A dedicated ``cupy.cuda.MemoryPool`` on one device. Thread-safe."""

    def __init__(self, cupy: Any, device_id: int, *, limit_bytes: int | None = None) -> None:
        # limit_bytes is recorded, not enforced: the ledger holds the cap (only
        # RMM domains add a physical backstop).
        super().__init__(cupy, device_id, limit_bytes=limit_bytes)
        with cupy.cuda.Device(device_id):
            self._pool = cupy.cuda.MemoryPool()

    def allocate(self, size: int) -> Any:
        return self._pool.malloc(size)

    def physical_usage(self) -> tuple[int, int]:
        # MemoryPool reports the pool of the *current* device: enter ours.
        with self._cp.cuda.Device(self.device_id):
            return int(self._pool.used_bytes()), int(self._pool.total_bytes())

    def release_unused(self) -> int:
        pool = self._pool
        with self._cp.cuda.Device(self.device_id):
            before = int(pool.total_bytes())
            pool.free_all_blocks()
            returned = before - int(pool.total_bytes())
        self.count_release(returned)
        return returned
