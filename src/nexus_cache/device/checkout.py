"""What ``checkout_or_claim`` hands back: a value, how it was obtained, and the pin
that keeps the resident entry alive for as long as anything derived from it lives.

A hit pins the resident source entry and gives the caller a copy in its own
domain. The pin is shared by every :class:`SourceCheckout` derived from that
result (:meth:`SourceCheckout.derive`): the entry stays Pinned until the last
of them is released.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from nexus_cache.device.residency import PinHandle
from nexus_cache.errors import LifecycleError

__all__ = ["CheckoutStatus", "PinLease", "SourceCheckout", "SourceDiagnostics"]


class CheckoutStatus(enum.Enum):
    #: copied from a resident entry (pinned)
    HIT = "hit"
    #: this caller decoded (it was elected leader)
    LEADER = "leader"
    #: another caller decoded; this one waited and copied the result
    FOLLOWER = "follower"
    #: the request bypassed the cache (see ``SourceDiagnostics.bypass``)
    BYPASS = "bypass"
    #: decoded without the cache (cache closed or not installed)
    UNCACHED = "uncached"


@dataclass(frozen=True)
class SourceDiagnostics:
    """How one request was served. Never holds the key's identity, only its fingerprint."""

    fingerprint: str
    status: CheckoutStatus
    detail: str
    bypass: str | None = None
    waited_s: float = 0.0
    retained: bool | None = None
    leader_attempts: int = 0


class PinLease:
    """A pin shared by several holders; released when the last holder releases.

    Thread-safe. :meth:`share` adds a holder; :meth:`release_share` drops one.
    """

    __slots__ = ("_handle", "_holders", "_lock")

    def __init__(self, handle: PinHandle) -> None:
        self._handle = handle
        self._holders = 1
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"PinLease(holders={self._holders}, {self._handle!r})"

    @property
    def holders(self) -> int:
        return self._holders

    @property
    def released(self) -> bool:
        return self._handle.released

    def share(self) -> PinLease:
        with self._lock:
            if self._holders == 0:
                raise LifecycleError("the pin was released; nothing can derive from it now")
            self._holders += 1
        return self

    def release_share(self) -> None:
        with self._lock:
            if self._holders == 0:
                raise LifecycleError("the pin lease was already released by every holder")
            self._holders -= 1
            last = self._holders == 0
        if last:
            self._handle.release()


class SourceCheckout:
    """A caller's source frame and the pin (if any) it carries. Release exactly once.

    ``value`` is the caller's own object (a copy in its domain, or its own
    decode), or, for a hit checked out with ``borrow=True``, the resident
    entry's value itself, to read (never release) while the checkout is held;
    ``lease`` is the shared pin of a hit, None otherwise. As a
    context manager it releases on exit. A checkout belongs to one holder;
    give each other consumer its own (:meth:`derive`): the shared pin is
    thread-safe, a single checkout is not.
    """

    __slots__ = ("_diagnostics", "_lease", "_released", "_value")

    def __init__(self, value: Any, diagnostics: SourceDiagnostics, lease: PinLease | None) -> None:
        self._value = value
        self._diagnostics = diagnostics
        self._lease = lease
        self._released = False

    def __repr__(self) -> str:
        d = self._diagnostics
        return f"SourceCheckout({d.status.value}, {d.fingerprint}, released={self._released})"

    @property
    def value(self) -> Any:
        if self._released:
            raise LifecycleError("this source checkout was released")
        return self._value

    @property
    def status(self) -> CheckoutStatus:
        return self._diagnostics.status

    @property
    def diagnostics(self) -> SourceDiagnostics:
        return self._diagnostics

    @property
    def lease(self) -> PinLease | None:
        return self._lease

    @property
    def released(self) -> bool:
        return self._released

    def derive(self, value: Any) -> SourceCheckout:
        """A dependent result (a slice, a projection) that carries the same pin."""
        if self._released:
            raise LifecycleError("cannot derive from a released source checkout")
        lease = None if self._lease is None else self._lease.share()
        return SourceCheckout(value, self._diagnostics, lease)

    def release(self) -> None:
        """Drop this holder's share of the pin; the last share unpins the entry."""
        if self._released:
            raise LifecycleError("this source checkout was already released")
        self._released = True
        self._value = None
        if self._lease is not None:
            self._lease.release_share()

    def __enter__(self) -> SourceCheckout:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._released:
            self.release()
