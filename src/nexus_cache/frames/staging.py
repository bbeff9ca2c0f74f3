"""Host-to-device transfers into an allocation domain.

On CUDA, host buffers go to the device through a ring of reusable pinned
(page-locked) staging slots on one non-blocking stream:

1. the host copies the next part of a buffer into the current slot (a plain
   memory copy, which NumPy does without holding the GIL);
2. an asynchronous copy from that slot to the destination is queued on the
   stream, and the host moves on at once;
3. when a slot is full the host records an event on the stream and moves to
   the next slot, waiting first for that slot's own event (its previous copy
   is then done), so the host fills one slot while the copy engine drains
   another.

Many small host buffers bound for one device buffer (the pages of a
decoder's heap) go as one image (:meth:`Transfer.pieces_to_device`): each
piece copied into the slot at its place, the gaps zeroed, and one
asynchronous copy per slot filled, instead of one per piece. A large image's
slot is written by several threads at once (the shared pool of
:mod:`nexus_cache._workers`, one thread per 2 MiB of the slot's run, at most
the pool's size; :func:`._slots.plan_fills` says which bytes each writes),
while the copy engine drains the slot written before; an image under 4 MiB
is written by the calling thread.

A :class:`PinnedStaging` (slots, stream, events) is reused across transfers:
``PinnedStaging.acquire`` hands one out of a small per-device pool and
``release`` returns it; each is used by one transfer at a time. On the host
backend a transfer is a plain copy.

Every device allocation a transfer's user makes happens inside the domain's
scope (:meth:`Transfer.device`); nothing reaches CuPy's default pool.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import numpy as np

from nexus_cache._sizes import parse_size
from nexus_cache._workers import WORKERS, run_tasks
from nexus_cache.backends import AllocationDomain
from nexus_cache.errors import ConfigError
from nexus_cache.frames._slots import fill_part, image_pieces, plan_fills

__all__ = [
    "DEFAULT_SLOT_BYTES",
    "DEFAULT_SLOTS",
    "PinnedStaging",
    "Transfer",
    "TransferStats",
    "check_staging",
    "open_transfer",
]

#: Size of one pinned staging slot: large enough that a copy runs at the
#: link's speed, small enough that three stay cheap to keep.
DEFAULT_SLOT_BYTES = 32 << 20
DEFAULT_SLOTS = 3
_POOL_KEEP = 2  # idle stagings kept per device
#: A slot's run of an image is written by one thread per this many bytes (at
#: most the shared pool's threads): an image under twice this is one thread's.
_PART_BYTES = 2 << 20


@dataclass
class TransferStats:
    """What one transfer moved. ``h2d_seconds`` is, on CUDA, the sum of the
    copy engine's busy time (CUDA events around each copy, when timing was
    asked for); on the host, the time of the copies. ``staging_seconds`` is
    the calling thread's wall time spent filling pinned slots, waits for a
    free slot included (the threads that fill a slot together count once;
    zero on the host backend).
    """

    h2d_bytes: int = 0
    h2d_copies: int = 0
    h2d_seconds: float = 0.0
    staging_seconds: float = 0.0
    #: host buffers the domain took as they are, with no copy (:meth:`Transfer.adopt`)
    adopted_bytes: int = 0

    def add(self, other: TransferStats) -> None:
        """Accumulate ``other`` into these figures."""
        self.adopted_bytes += other.adopted_bytes
        self.h2d_bytes += other.h2d_bytes
        self.h2d_copies += other.h2d_copies
        self.h2d_seconds += other.h2d_seconds
        self.staging_seconds += other.staging_seconds


class Transfer:
    """Host-to-device copies into one domain (the host backend's plain copy).

    Not thread-safe: one thread drives a transfer. Device work on the
    destination arrays is ordered with the copies when done inside
    :meth:`device`.
    """

    #: The domain's memory is host memory: a host buffer can be kept and
    #: copied later at no transfer cost (so a builder may copy once at the end
    #: instead of staging each piece on the device first).
    host_memory: ClassVar[bool] = True

    def __init__(self, domain: AllocationDomain) -> None:
        self.domain = domain
        self.stats = TransferStats()

    @contextmanager
    def device(self) -> Iterator[None]:
        """Allocate in the domain (and, on CUDA, queue work on the transfer's stream)."""
        with self.domain.scope():
            yield

    def adopt(self, host: np.ndarray) -> Any | None:
        """``host`` itself as an array of the domain, with no copy, where the domain
        takes it (the host backend's; see ``AllocationDomain.adopt``: nothing else
        may read, write or free it), else None: copy it in."""
        taken = self.domain.adopt(host)
        if taken is not None:
            self.stats.adopted_bytes += int(host.nbytes)
        return taken

    def to_device(self, host: np.ndarray, dst: Any) -> None:
        """Copy ``host`` into the contiguous device array ``dst`` of the same bytes."""
        started = time.perf_counter()
        np.copyto(dst, host, casting="no")
        self.stats.h2d_seconds += time.perf_counter() - started
        self.stats.h2d_bytes += int(host.nbytes)
        self.stats.h2d_copies += 1

    def pieces_to_device(self, pieces: Sequence[tuple[int, Any]], nbytes: int, dst: Any) -> None:
        """Make the first ``nbytes`` of the contiguous byte array ``dst`` the image
        of ``pieces`` (``(offset, bytes-like)`` in increasing order, none
        overlapping the next), zeros between them: one copy here, one per
        pinned slot filled on CUDA. ValueError for pieces out of order or
        past ``nbytes`` (on CUDA, any copy it queued is done by then)."""
        started = time.perf_counter()
        view = _bytes_of(dst, nbytes)
        at = 0
        for offset, src in image_pieces(pieces, nbytes):
            view[at:offset] = 0
            view[offset : offset + src.size] = src
            at = offset + src.size
        view[at:nbytes] = 0
        self.stats.h2d_seconds += time.perf_counter() - started
        self.stats.h2d_bytes += nbytes
        self.stats.h2d_copies += 1

    def read_into(self, reader: Any, nbytes: int, dst: Any) -> None:
        """Fill ``dst`` (``nbytes`` contiguous bytes) from ``reader.readinto``."""
        started = time.perf_counter()
        view = memoryview(dst.reshape(-1).view(np.uint8))
        pos = 0
        while pos < nbytes:
            pos += _read_some(reader, view[pos:nbytes], pos, nbytes)
        self.stats.h2d_seconds += time.perf_counter() - started
        self.stats.h2d_bytes += nbytes
        self.stats.h2d_copies += 1

    def finish(self) -> None:
        """Wait until every queued copy and device operation is done."""

    def close(self) -> None:
        """Give back what the transfer borrowed (idempotent)."""


def check_staging(slot_bytes: int | str, slots: int) -> tuple[int, int]:
    """Validated ``(slot_bytes, slots)``; ``slot_bytes`` may be a size string ("32MiB")."""
    size = parse_size(slot_bytes, name="slot_bytes")
    if size < 4096:
        raise ConfigError(f"slot_bytes={slot_bytes!r} is too small; accepted: >= 4096 bytes")
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 2:
        raise ConfigError(f"slots={slots!r}; accepted: an int >= 2 (one fills while one copies)")
    return size, slots


def _read_some(reader: Any, into: memoryview, pos: int, nbytes: int) -> int:
    got = reader.readinto(into)
    if not got:
        raise OSError(f"the source ended after {pos} of {nbytes} bytes")
    return int(got)


def _bytes_of(dst: Any, nbytes: int) -> Any:
    """``dst`` (contiguous, at least ``nbytes``) as a flat uint8 array."""
    if nbytes > int(dst.nbytes) or not dst.flags.c_contiguous:
        raise ValueError(f"destination of {dst.nbytes} B does not take {nbytes} B contiguously")
    return dst.reshape(-1).view(np.uint8)


class PinnedStaging:
    """A ring of pinned host slots and one stream on one CUDA device.

    Not thread-safe; use :meth:`acquire` / :meth:`release` to share.
    """

    _pool_lock: ClassVar[threading.Lock] = threading.Lock()
    _pool: ClassVar[dict[tuple[int, int, int], list[PinnedStaging]]] = {}

    def __init__(
        self, device_id: int, slot_bytes: int = DEFAULT_SLOT_BYTES, slots: int = DEFAULT_SLOTS
    ) -> None:
        slot_bytes, slots = check_staging(slot_bytes, slots)
        import cupy
        import cupyx

        self.cupy = cupy
        self.device_id = device_id
        self.slot_bytes = slot_bytes
        with cupy.cuda.Device(device_id):
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self.events = [cupy.cuda.Event(disable_timing=True) for _ in range(slots)]
        # NumPy arrays over page-locked memory: the copy engine reads them directly.
        self.buffers = [cupyx.empty_pinned((slot_bytes,), np.uint8) for _ in range(slots)]
        self.pointers = [int(b.ctypes.data) for b in self.buffers]

    @classmethod
    def acquire(
        cls, device_id: int, slot_bytes: int = DEFAULT_SLOT_BYTES, slots: int = DEFAULT_SLOTS
    ) -> PinnedStaging:
        """An idle staging of this shape from the pool, or a new one."""
        with cls._pool_lock:
            idle = cls._pool.get((device_id, slot_bytes, slots))
            if idle:
                return idle.pop()
        return cls(device_id, slot_bytes, slots)

    def release(self) -> None:
        """Return to the pool (after its stream is idle)."""
        self.stream.synchronize()
        key = (self.device_id, self.slot_bytes, len(self.buffers))
        with self._pool_lock:
            idle = self._pool.setdefault(key, [])
            if len(idle) < _POOL_KEEP:
                idle.append(self)


class _CudaTransfer(Transfer):
    host_memory = False

    def __init__(
        self,
        domain: AllocationDomain,
        staging: PinnedStaging,
        timing: bool,
        part_bytes: int = _PART_BYTES,
    ) -> None:
        super().__init__(domain)
        self._staging = staging
        self._part_bytes = part_bytes
        self._cp = staging.cupy
        self._timing = timing
        self._timed: list[tuple[Any, Any]] = []
        self._slot = 0
        self._used = 0
        self._closed = False

    @contextmanager
    def device(self) -> Iterator[None]:
        with ExitStack() as stack:
            stack.enter_context(self.domain.scope())
            stack.enter_context(self._staging.stream)
            yield

    def _next_slot(self) -> None:
        staging = self._staging
        staging.events[self._slot].record(staging.stream)
        self._slot = (self._slot + 1) % len(staging.buffers)
        staging.events[self._slot].synchronize()  # its last copy has left it
        self._used = 0

    def to_device(self, host: np.ndarray, dst: Any) -> None:
        src = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        n = int(src.nbytes)
        if n != int(dst.nbytes) or not dst.flags.c_contiguous:
            raise ValueError(f"destination of {dst.nbytes} B does not take {n} B contiguously")
        staging, dst_ptr, pos = self._staging, int(dst.data.ptr), 0
        while pos < n:
            room = staging.slot_bytes - self._used
            if room == 0:
                self._next_slot()
                continue
            k = min(room, n - pos)
            started = time.perf_counter()
            np.copyto(staging.buffers[self._slot][self._used : self._used + k], src[pos : pos + k])
            self.stats.staging_seconds += time.perf_counter() - started
            self._queue_copy(dst_ptr + pos, k)
            pos += k
        self.stats.h2d_bytes += n

    def _queue_copy(self, dst_ptr: int, k: int) -> None:
        """Copy the ``k`` bytes from the current slot's first free byte to ``dst_ptr``."""
        self._memcpy(dst_ptr, self._used, k)
        self._used += k

    def _memcpy(self, dst_ptr: int, at: int, k: int) -> None:
        """Queue the copy of bytes ``[at, at + k)`` of the current slot to ``dst_ptr``."""
        staging, cp = self._staging, self._cp
        events = None
        if self._timing:
            events = (cp.cuda.Event(), cp.cuda.Event())
            events[0].record(staging.stream)
        cp.cuda.runtime.memcpyAsync(
            dst_ptr,
            staging.pointers[self._slot] + at,
            k,
            cp.cuda.runtime.memcpyHostToDevice,
            staging.stream.ptr,
        )
        if events is not None:
            events[1].record(staging.stream)
            self._timed.append(events)
        self.stats.h2d_copies += 1

    def pieces_to_device(self, pieces: Sequence[tuple[int, Any]], nbytes: int, dst: Any) -> None:
        # The image is written into the slots in order (plan_fills), each
        # slot's run by a few threads at once when it is large, and goes in
        # one copy once written; the next slot is written while it is copied.
        if nbytes > int(dst.nbytes) or not dst.flags.c_contiguous:
            raise ValueError(f"destination of {dst.nbytes} B does not take {nbytes} B")
        staging, dst_ptr = self._staging, int(dst.data.ptr)
        started = time.perf_counter()
        plan = plan_fills(
            pieces, nbytes, self._used, staging.slot_bytes, self._part_bytes, WORKERS
        )
        try:
            for fill in plan:
                if fill.next_slot:
                    self._next_slot()
                slot = staging.buffers[self._slot]
                run_tasks(
                    [partial(fill_part, slot, ops) for ops in fill.parts],
                    parallel=len(fill.parts) > 1,
                )
                self._used = fill.slot_at + fill.size
                self._memcpy(dst_ptr + fill.image_at, fill.slot_at, fill.size)
        except BaseException:
            # every task has finished (run_tasks waits), and the copies queued
            # so far are done before the error reaches the caller, who may
            # then free ``dst`` and the pieces at once
            staging.stream.synchronize()
            raise
        self.stats.staging_seconds += time.perf_counter() - started
        self.stats.h2d_bytes += nbytes

    def read_into(self, reader: Any, nbytes: int, dst: Any) -> None:
        if nbytes > int(dst.nbytes) or not dst.flags.c_contiguous:
            raise ValueError(f"destination of {dst.nbytes} B does not take {nbytes} B")
        staging, dst_ptr, pos = self._staging, int(dst.data.ptr), 0
        while pos < nbytes:
            room = staging.slot_bytes - self._used
            if room == 0:
                self._next_slot()
                continue
            k = min(room, nbytes - pos)
            started = time.perf_counter()
            slot = memoryview(staging.buffers[self._slot])[self._used : self._used + k]
            k = _read_some(reader, slot, pos, nbytes)
            self.stats.staging_seconds += time.perf_counter() - started
            self._queue_copy(dst_ptr + pos, k)
            pos += k
        self.stats.h2d_bytes += nbytes

    def finish(self) -> None:
        self._staging.stream.synchronize()
        if self._timed:
            elapsed = self._cp.cuda.get_elapsed_time
            self.stats.h2d_seconds += sum(elapsed(a, b) for a, b in self._timed) / 1000.0
            self._timed.clear()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._staging.release()


def open_transfer(
    domain: AllocationDomain,
    *,
    timing: bool = False,
    slot_bytes: int | str = DEFAULT_SLOT_BYTES,
    slots: int = DEFAULT_SLOTS,
) -> Transfer:
    """A transfer into ``domain``: through pinned staging when the domain's memory
    is device memory (CUDA), a plain copy when it is host memory.

    Close it when done (it returns its pinned slots to the pool). Raises
    ConfigError for a slot size under 4096 bytes or fewer than 2 slots.
    """
    slot_bytes, slots = check_staging(slot_bytes, slots)
    if not domain.host_memory:
        staging = PinnedStaging.acquire(domain.device_id, slot_bytes, slots)
        return _CudaTransfer(domain, staging, timing)
    return Transfer(domain)
