"""Backend selection and the host backend's tracking allocator."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from nexus_cache.backends import (
    ALLOCATION_ROUNDING_BYTES,
    ENV_DEVICE_BACKEND,
    HostBackend,
    HostStream,
    round_allocation,
    select_backend,
)
from nexus_cache.backends.host import ENV_HOST_DEVICE_TOTAL_BYTES
from nexus_cache.errors import (
    BackendUnavailableError,
    CapacityError,
    ConfigError,
    LifecycleError,
)

_HAS_CUPY = importlib.util.find_spec("cupy") is not None


def test_round_allocation_matches_cupy_granularity() -> None:
    assert ALLOCATION_ROUNDING_BYTES == 512
    assert [round_allocation(n) for n in (0, 1, 511, 512, 513, 1024)] == [
        0,
        512,
        512,
        512,
        1024,
        1024,
    ]


@pytest.mark.parametrize("value", ["host", "HOST", " host "])
def test_select_host_by_env(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(ENV_DEVICE_BACKEND, value)
    assert select_backend().name == "host"


def test_bad_env_value_names_variable_value_and_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_DEVICE_BACKEND, "rocm")
    with pytest.raises(ConfigError) as info:
        select_backend()
    message = str(info.value)
    assert ENV_DEVICE_BACKEND in message
    assert "'rocm'" in message
    assert "auto, cuda, host" in message


def test_bad_argument_value_is_config_error() -> None:
    with pytest.raises(ConfigError, match="backend name='tpu'"):
        select_backend("tpu")


@pytest.mark.skipif(_HAS_CUPY, reason="CuPy is installed here")
def test_cuda_without_cupy_is_unavailable_and_auto_falls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(BackendUnavailableError, match="NEXUS_DEVICE_BACKEND=host"):
        select_backend("cuda")
    monkeypatch.setenv(ENV_DEVICE_BACKEND, "auto")
    assert select_backend().name == "host"
    monkeypatch.delenv(ENV_DEVICE_BACKEND)
    assert select_backend().name == "host"


def test_host_total_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_HOST_DEVICE_TOTAL_BYTES, "4096")
    assert HostBackend().mem_info(0).total_bytes == 4096
    monkeypatch.setenv(ENV_HOST_DEVICE_TOTAL_BYTES, "-1")
    with pytest.raises(ConfigError, match=ENV_HOST_DEVICE_TOTAL_BYTES):
        HostBackend()


@pytest.mark.parametrize("total", [0, -5, 1.5, True])
def test_host_rejects_bad_total(total: object) -> None:
    with pytest.raises(ConfigError):
        HostBackend(device_total_bytes=total)  # type: ignore[arg-type]


def test_bad_device_id_names_accepted_range() -> None:
    backend = HostBackend(device_total_bytes=1 << 20, device_count=2)
    with pytest.raises(ConfigError, match=r"accepted: 0\.\.1"):
        backend.mem_info(2)
    with pytest.raises(ConfigError):
        backend.create_domain(-1)


def test_domain_counts_rounded_bytes_and_frees_on_last_view() -> None:
    backend = HostBackend(device_total_bytes=1 << 20)
    domain = backend.create_domain(0)
    with domain.scope() as scope:
        a = domain.empty((10, 10), np.float64)  # 800 B -> 1024
        b = domain.copy_in(np.arange(3, dtype=np.int32))  # 12 B -> 512
    assert scope.allocated_bytes == 1536
    assert scope.allocations == 2
    assert domain.allocation_bytes(a) == 1024
    assert domain.allocation_bytes(a[3:5]) == 1024  # a view counts its whole allocation
    assert domain.measured_bytes([a, a[1], b]) == 1536
    assert b.tolist() == [0, 1, 2]
    assert domain.counters().used_bytes == 1536
    assert backend.mem_info(0).free_bytes == (1 << 20) - 1536

    view = a[2]
    del a
    assert domain.counters().used_bytes == 1536  # the view keeps the block alive
    del view
    counters = domain.counters()
    assert counters.used_bytes == 512
    assert counters.held_bytes == 1536  # freed block still held, as a pool holds it
    assert backend.mem_info(0).free_bytes == (1 << 20) - 1536
    assert domain.release_unused() == 1024
    assert backend.mem_info(0).free_bytes == (1 << 20) - 512
    del b
    domain.close()
    assert domain.closed
    assert backend.mem_info(0).free_bytes == 1 << 20


def test_domain_refuses_foreign_arrays_and_close_while_live() -> None:
    domain = HostBackend(device_total_bytes=1 << 20).create_domain(0)
    with pytest.raises(LifecycleError, match="not allocated in the cache domain"):
        domain.allocation_bytes(np.zeros(4))
    keep = domain.empty(8, np.uint8)
    with pytest.raises(LifecycleError, match="still live"):
        domain.close()
    del keep
    domain.close()
    with pytest.raises(LifecycleError, match="closed"):
        domain.empty(8, np.uint8)


def test_host_domain_adopts_a_decoders_buffer_as_it_is_and_nothing_else() -> None:
    """``adopt`` books a host array nothing else owns (a view of an Arrow buffer) as
    an allocation of the domain, rounded as ``empty`` rounds, freed with its last
    view; it takes no array it cannot own whole and never a closed domain's."""
    import pyarrow as pa

    backend = HostBackend(device_total_bytes=1 << 20)
    domain = backend.create_domain(0)
    decoded = np.frombuffer(pa.allocate_buffer(800), np.float64)  # 800 B -> 1024
    with domain.scope() as scope:
        taken = domain.adopt(decoded)
    assert taken is decoded  # the same memory: no copy
    assert scope.allocations == 1
    assert scope.allocated_bytes == 1024
    assert domain.allocation_bytes(taken[10:20]) == 1024
    assert domain.measured_bytes([taken, taken[1:]]) == 1024
    assert backend.mem_info(0).free_bytes == (1 << 20) - 1024
    assert domain.adopt(decoded) is None  # booked once
    owned = np.arange(100, dtype=np.int64)
    refused = [
        np.frombuffer(b"x" * 64, np.uint8),  # read-only
        owned[::2],  # not contiguous
        owned[10:],  # a view of a NumPy array: that array owns the memory
        np.frombuffer(pa.allocate_buffer(0), np.uint8),  # empty
        [1, 2, 3],  # not an array
    ]
    assert [domain.adopt(a) for a in refused] == [None] * len(refused)
    assert domain.counters().used_bytes == 1024
    view = taken[3:]
    del taken, decoded
    assert domain.counters().used_bytes == 1024  # a view keeps it
    del view
    assert domain.counters().used_bytes == 0
    assert domain.counters().held_bytes == 1024  # held as a freed block, as empty's
    domain.close()
    with pytest.raises(LifecycleError, match="closed"):
        domain.adopt(np.frombuffer(pa.allocate_buffer(64), np.uint8))
    assert backend.mem_info(0).free_bytes == 1 << 20


def test_a_failed_host_allocation_leaves_no_live_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host memory refusing a block (MemoryError) books nothing as live: the bytes
    taken from the simulated device stay with the domain as a free block, as a pool
    keeps one, and the domain still closes."""
    import nexus_cache.backends.host as host

    backend = HostBackend(device_total_bytes=1 << 20)
    domain = backend.create_domain(0)

    def refused(size: int) -> np.ndarray:
        raise MemoryError(f"no {size} bytes")

    monkeypatch.setattr(host, "_fresh_bytes", refused)
    with pytest.raises(MemoryError):
        domain.empty(1000, np.uint8)
    counters = domain.counters()
    assert counters.used_bytes == 0
    assert counters.allocations == 0
    assert counters.held_bytes == 1024
    monkeypatch.undo()
    again = domain.empty(1000, np.uint8)  # the held block is reused
    assert backend.mem_info(0).free_bytes == (1 << 20) - 1024
    del again
    assert domain.release_unused() == 1024
    domain.close()
    assert backend.mem_info(0).free_bytes == 1 << 20


def test_host_device_out_of_memory_is_capacity_error() -> None:
    domain = HostBackend(device_total_bytes=4096).create_domain(0)
    keep = domain.empty(4000, np.uint8)
    with pytest.raises(CapacityError, match=r"4096 B"):
        domain.empty(600, np.uint8)
    assert domain.counters().used_bytes == 4096
    del keep


def test_scope_counts_only_its_own_thread() -> None:
    import threading

    domain = HostBackend(device_total_bytes=1 << 20).create_domain(0)
    kept = []
    with domain.scope() as scope:
        worker = threading.Thread(target=lambda: kept.append(domain.empty(5000, np.uint8)))
        worker.start()
        worker.join()
        kept.append(domain.empty(100, np.uint8))
    assert scope.allocated_bytes == 512
    assert domain.counters().used_bytes == 512 + 5120


def test_host_synchronize_runs_streams() -> None:
    backend = HostBackend(device_total_bytes=1 << 20)
    backend.synchronize(0, [HostStream()])

    class Boom:
        def synchronize(self) -> None:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        backend.synchronize(0, [Boom()])
    assert backend.xp is np
    assert backend.sparse.__name__ == "scipy.sparse"


def test_bad_allocator_setting_is_config_error_before_cuda_is_touched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nexus_cache.backends.cuda import CudaBackend
    from nexus_cache.backends.kinds import ENV_DEVICE_ALLOCATOR

    with pytest.raises(ConfigError, match="allocator='jemalloc'"):
        CudaBackend(allocator="jemalloc")
    monkeypatch.setenv(ENV_DEVICE_ALLOCATOR, "arena")
    with pytest.raises(ConfigError, match=f"{ENV_DEVICE_ALLOCATOR}='arena'.*auto, rmm, cupy"):
        CudaBackend()


def test_rmm_module_imports_without_rmm_and_says_so() -> None:
    from nexus_cache.backends.rmm import rmm_available

    assert rmm_available() == (importlib.util.find_spec("rmm") is not None)


def _minor_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@pytest.mark.skipif(sys.platform != "linux", reason="counts Linux page faults")
def test_host_domain_reuses_mapped_pages_for_new_allocations() -> None:
    """A new allocation the size of a decoded column writes into pages already mapped:
    a cold query allocates its frames fresh, and a page fault per 4 KiB page on the
    first write cost as much as the copy into it."""
    import pyarrow as pa

    if pa.default_memory_pool().backend_name == "system":
        pytest.skip("ARROW_DEFAULT_MEMORY_POOL=system: Arrow's pool is the C allocator")
    domain = HostBackend(device_total_bytes=1 << 30).create_domain(0)
    sizes = [512 << 10] * 8  # 4 MiB in blocks of 512 KiB: past glibc's mmap threshold
    pages = sum(sizes) // 4096

    def one_round() -> int:
        before = _minor_faults()
        arrays = [domain.empty(n, np.uint8) for n in sizes]
        for a in arrays:
            a.fill(1)  # the first write of every page
        del arrays, a
        return _minor_faults() - before

    one_round()  # the first round maps the pages
    best = min(one_round() for _ in range(5))
    assert best < pages // 4, f"{best} page faults for {pages} pages written"
    assert domain.physical_usage()[0] == 0
