"""The allocation-domain contract every backend's domain passes.

Each check takes a :class:`DeviceBackend`; the host backend runs them in CI
(``test_domain_contract.py``), the CuPy-pool and RMM domains on the GPU
machine (``tests/gpu/test_device_gpu.py``).
"""

from __future__ import annotations

import gc
import threading
from typing import Any

import numpy as np
import pytest

from nexus_cache.backends import DeviceBackend
from nexus_cache.errors import LifecycleError


def _outside(backend: DeviceBackend, nbytes: int) -> Any:
    """An array of the backend's module that no domain allocated."""
    return backend.xp.zeros(nbytes, dtype=np.uint8)


def check_measures_rounded_allocations(backend: DeviceBackend) -> None:
    domain = backend.create_domain(0)
    with domain.scope() as scope:
        a = domain.empty((10, 10), np.float64)  # 800 B -> 1024
        b = domain.copy_in(np.arange(3, dtype=np.int32))  # 12 B -> 512
    assert scope.allocated_bytes == 1536
    assert scope.allocations == 2
    assert domain.allocation_bytes(a) == 1024
    assert domain.allocation_bytes(a[3:5]) == 1024  # a view counts its whole allocation
    assert domain.measured_bytes([a, a[1], b]) == 1536
    assert np.asarray(b.get() if hasattr(b, "get") else b).tolist() == [0, 1, 2]
    counters = domain.counters()
    assert counters.used_bytes == 1536
    assert counters.allocations == 2
    assert counters.allocated_bytes == 1536
    del a, b
    assert domain.counters().used_bytes == 0
    domain.close()


def check_freed_blocks_are_held_until_released(backend: DeviceBackend) -> None:
    domain = backend.create_domain(0)
    arrays = [domain.empty(4096, np.uint8) for _ in range(3)]
    assert domain.counters().used_bytes == 3 * 4096
    arrays.clear()
    counters = domain.counters()
    assert counters.used_bytes == 0
    assert counters.held_bytes >= 3 * 4096  # freed blocks stay with the domain
    returned = domain.release_unused()
    assert returned == counters.held_bytes
    after = domain.counters()
    assert after.held_bytes == 0
    assert after.releases == 1
    assert after.returned_bytes == returned
    domain.close()


def check_refuses_foreign_arrays(backend: DeviceBackend) -> None:
    domain = backend.create_domain(0)
    with pytest.raises(LifecycleError):
        domain.allocation_bytes(_outside(backend, 4096))
    with pytest.raises(LifecycleError):
        domain.allocation_bytes(np.zeros(16, np.uint8))
    other = backend.create_domain(0)
    theirs = other.empty(512, np.uint8)
    with pytest.raises(LifecycleError):
        domain.allocation_bytes(theirs)
    del theirs
    other.close()
    domain.close()


def check_close_refuses_while_live_then_refuses_allocations(backend: DeviceBackend) -> None:
    domain = backend.create_domain(0)
    keep = domain.empty(8, np.uint8)
    with pytest.raises(LifecycleError, match="still live"):
        domain.close()
    assert not domain.closed
    del keep
    domain.close()
    assert domain.closed
    domain.close()  # idempotent
    with pytest.raises(LifecycleError, match="closed"):
        domain.empty(8, np.uint8)


def check_scope_counts_only_its_thread(backend: DeviceBackend) -> None:
    domain = backend.create_domain(0)
    kept: list[Any] = []
    with domain.scope() as scope:
        worker = threading.Thread(target=lambda: kept.append(domain.empty(5000, np.uint8)))
        worker.start()
        worker.join()
        kept.append(domain.empty(100, np.uint8))
    assert scope.allocated_bytes == 512
    assert domain.counters().used_bytes == 512 + 5120
    kept.clear()
    domain.close()


def check_limit(backend: DeviceBackend) -> None:
    domain = backend.create_domain(0, limit_bytes=64 * 1024)
    assert domain.limit_bytes == 64 * 1024
    keep = domain.empty(48 * 1024, np.uint8)
    if domain.enforces_limit:
        with pytest.raises(MemoryError):
            domain.empty(32 * 1024, np.uint8)
        assert domain.counters().used_bytes == 48 * 1024
    del keep
    domain.close()


def check_adopts_host_memory_only_where_it_lives(backend: DeviceBackend) -> None:
    """A decoded host buffer becomes an allocation of a host-memory domain as it is;
    a device domain takes none (the caller copies it in)."""
    import pyarrow as pa

    domain = backend.create_domain(0)
    decoded = np.frombuffer(pa.allocate_buffer(1000), np.uint8)
    taken = domain.adopt(decoded)
    if domain.host_memory:
        assert taken is decoded
        assert domain.allocation_bytes(taken) == 1024
    else:
        assert taken is None
        assert domain.counters().used_bytes == 0
    del taken, decoded
    assert domain.counters().used_bytes == 0
    domain.close()


def check_disowns_host_memory_only_where_it_lives(backend: DeviceBackend) -> None:
    """A host-memory domain gives a live allocation away: off its books (used and
    held), its bytes back to the device, its memory still the array's; a device
    domain gives none (the allocation stays booked). Neither gives a view, a
    foreign array or an allocation twice."""
    domain = backend.create_domain(0)
    free = backend.mem_info(0).free_bytes  # the simulated device's (host) only
    array = domain.empty(1000, np.uint8)  # 1024 B booked
    array.fill(7)
    root = domain.root_of(array)
    assert domain.disown(_outside(backend, 1000)) is None
    assert domain.disown(root[1:]) is None  # a view
    other = backend.create_domain(0)
    assert other.disown(root) is None  # not its allocation
    other.close()
    taken = domain.disown(root)
    if domain.host_memory:
        assert taken is root
        counters = domain.counters()
        assert (counters.used_bytes, counters.held_bytes) == (0, 0)  # not a free block
        assert backend.mem_info(0).free_bytes == free
        with pytest.raises(LifecycleError):
            domain.allocation_bytes(array)
        assert domain.disown(root) is None  # given once
        domain.close()  # nothing of it is live in the domain now
        assert np.asarray(array).tolist() == [7] * 1000
        del taken, root, array
        assert backend.mem_info(0).free_bytes == free  # the device never held it again
    else:
        assert taken is None
        assert domain.allocation_bytes(array) == 1024
        assert domain.counters().used_bytes == 1024
        del taken, root, array
        assert domain.counters().used_bytes == 0
        domain.close()


def check_shares_host_memory_only_where_it_lives(backend: DeviceBackend) -> None:
    """A host-memory domain books a read-only twin of another domain's Arrow-backed
    allocation with no copy, each living on its own; a device domain shares none.
    Neither shares a view, nor memory that is not a reference-counted buffer."""
    import pyarrow as pa

    domain, other = backend.create_domain(0), backend.create_domain(0)
    root = other.root_of(other.empty(1000, np.uint8))  # 1024 B booked by other
    root.fill(5)
    assert domain.share(root[8:]) is None  # a view
    assert domain.share(_outside(backend, 64)) is None  # its own memory, not Arrow's
    twin = domain.share(root)
    if domain.host_memory:
        assert twin is not root
        assert np.shares_memory(twin, root)
        assert not twin.flags.writeable
        assert domain.allocation_bytes(twin) == 1024
        decoded = np.frombuffer(pa.allocate_buffer(100), np.uint8)  # Arrow's, no domain's
        shared = domain.share(decoded)
        assert domain.allocation_bytes(shared) == 512
        del shared, decoded
        del root  # the twin keeps the memory: other's books are clear
        gc.collect()
        assert other.counters().used_bytes == 0
        assert twin.tolist() == [5] * 1024
        assert domain.counters().used_bytes == 1024
        del twin
    else:
        assert twin is None
        del root
    gc.collect()
    assert domain.counters().used_bytes == 0
    assert other.counters().used_bytes == 0
    domain.close()
    other.close()


CONTRACT = (
    check_measures_rounded_allocations,
    check_adopts_host_memory_only_where_it_lives,
    check_disowns_host_memory_only_where_it_lives,
    check_shares_host_memory_only_where_it_lives,
    check_freed_blocks_are_held_until_released,
    check_refuses_foreign_arrays,
    check_close_refuses_while_live_then_refuses_allocations,
    check_scope_counts_only_its_thread,
    check_limit,
)
