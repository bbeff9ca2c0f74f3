"""The decode lead for one cold source key: the claim, the flight behind it.

The source cache hands a :class:`SourceClaim` to exactly one caller per cold
key (see ``cache.py``). The claim resolves once: publish, fail, or abandon;
the cache's :class:`ClaimOutcomes` say what each does to the flight.

Single flight: one decode leader, followers waiting. A :class:`DecodeFlight`
belongs to the source subdomain that created it and is only touched with
that subdomain's lock held (its condition shares the lock). States::

    LEADING --finish--> PUBLISHED            (followers check out or copy)
       |  \\--fail----> FAILED               (every follower gets the error)
       \\--hand_off--> HANDOFF --take_lead--> LEADING   (a follower leads)

Keepalive: the leader's value is attempt-owned and may be released as soon
as the leader has its checkout back. So ``finish`` counts the followers
waiting at that moment (the *copiers*) and holds the value for them; each
calls :meth:`DecodeFlight.copied` once it pinned the resident entry or
finished (or failed) copying the value, and the leader's
:meth:`DecodeFlight.await_copies` returns, dropping the flight's reference,
only when the last copier is done. Copiers never wait for anything but
their own copy, so the leader's wait is bounded by the slowest copy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from nexus_cache.device.checkout import CheckoutStatus, SourceCheckout, SourceDiagnostics
from nexus_cache.errors import (
    AdmissionClosedError,
    AttemptCancelledError,
    CapacityError,
    LifecycleError,
)

if TYPE_CHECKING:
    from nexus_cache.device.source.key import SourceFrameKey
    from nexus_cache.device.values import DeviceValue

__all__ = ["LEADER_LOCAL_ERRORS", "ClaimOutcomes", "SourceClaim"]

#: A leader failing with one of these failed for its own reason: a waiter
#: takes the lead instead of receiving the error.
LEADER_LOCAL_ERRORS: tuple[type[BaseException], ...] = (
    AttemptCancelledError,
    CapacityError,
    AdmissionClosedError,
    TimeoutError,
    KeyboardInterrupt,
    concurrent.futures.CancelledError,
    asyncio.CancelledError,
)


@dataclass(frozen=True)
class ClaimOutcomes:
    """What the owning cache does when a claim resolves (built by the cache)."""

    #: ``(flight, key, value, started, share) -> (retained, detail)``
    publish: Callable[[DecodeFlight, SourceFrameKey, Any, float, bool], tuple[bool, str]]
    #: ``(flight, key, error)``
    fail: Callable[[DecodeFlight, SourceFrameKey, BaseException], None]
    #: ``(flight, key, reason)``
    abandon: Callable[[DecodeFlight, SourceFrameKey, str], None]


class SourceClaim:
    """The decode lead for one key. Resolve it exactly once:

    * :meth:`publish` with the decoded value (retained when it fits);
    * :meth:`fail` with a deterministic decode error (every waiter gets it);
    * :meth:`abandon` when stopping for a reason of the leader's own.

    As a context manager an unresolved claim is resolved on exit: an
    exception in :data:`LEADER_LOCAL_ERRORS` (or none) abandons, any other
    fails. A claim with no flight (bypass, closed cache) touches nothing.
    Belongs to the thread that got it.
    """

    __slots__ = ("_flight", "_key", "_outcomes", "_resolved", "_started", "_status", "_waited")

    def __init__(
        self,
        outcomes: ClaimOutcomes | None,
        flight: DecodeFlight | None,
        key: SourceFrameKey,
        *,
        status: CheckoutStatus = CheckoutStatus.LEADER,
        waited_s: float = 0.0,
    ) -> None:
        """Built by the source cache; ``outcomes`` None means a claim that touches nothing."""
        self._outcomes = outcomes
        self._flight = flight
        self._key = key
        self._status = status
        self._waited = waited_s
        self._started = time.monotonic()
        self._resolved = False

    def __repr__(self) -> str:
        return f"SourceClaim({self._key.fingerprint}, {self._status.value})"

    @property
    def key(self) -> SourceFrameKey:
        return self._key

    @property
    def cached(self) -> bool:
        """False for a bypass or a closed cache: publishing retains nothing."""
        return self._flight is not None

    @property
    def resolved(self) -> bool:
        return self._resolved

    def publish(self, value: DeviceValue, *, share: bool = False) -> SourceCheckout:
        """Offer the decoded ``value`` to the cache and wake the followers.

        Returns the leader's checkout of its own ``value`` (no pin). Never
        fails for capacity: when the value cannot be retained the diagnostics
        say why. Returns only once every follower waiting now has its own
        copy (or a pin on the resident entry), so the caller may release
        ``value`` as soon as it has it back.

        ``share``: the caller promises that nothing writes ``value``'s buffers
        from now on; where the value can share its memory with the cache's
        domain (``share_into``: a host decode's Arrow buffers), the entry is
        made with no copy, with read-only buffers. Otherwise, and by default,
        the entry is a copy.
        """
        self._resolve()
        key = self._key
        if self._outcomes is None or self._flight is None:
            bypass = key.bypass
            detail = bypass.explanation if bypass else "uncached: the source cache is closed"
            diag = SourceDiagnostics(
                key.fingerprint,
                self._status,
                detail,
                bypass=None if bypass is None else bypass.value,
                retained=False,
            )
            return SourceCheckout(value, diag, None)
        retained, detail = self._outcomes.publish(self._flight, key, value, self._started, share)
        diag = SourceDiagnostics(
            key.fingerprint,
            CheckoutStatus.LEADER,
            detail,
            waited_s=self._waited,
            retained=retained,
            leader_attempts=self._flight.attempts,
        )
        return SourceCheckout(value, diag, None)

    def fail(self, error: BaseException) -> None:
        """The decode failed deterministically: every waiter raises ``SourceDecodeError``."""
        self._resolve()
        if self._outcomes is not None and self._flight is not None:
            self._outcomes.fail(self._flight, self._key, error)

    def abandon(self, reason: str = "") -> None:
        """The leader stops for its own reason; a waiter, if any, takes the lead."""
        self._resolve()
        if self._outcomes is not None and self._flight is not None:
            self._outcomes.abandon(self._flight, self._key, reason)

    def _resolve(self) -> None:
        if self._resolved:
            raise LifecycleError(f"{self!r} was already resolved")
        self._resolved = True

    def __enter__(self) -> SourceClaim:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._resolved:
            return
        if exc is None or isinstance(exc, LEADER_LOCAL_ERRORS):
            self.abandon("" if exc is None else type(exc).__name__)
        else:
            self.fail(exc)


class FlightState(enum.Enum):
    LEADING = "leading"
    HANDOFF = "handoff"
    PUBLISHED = "published"
    FAILED = "failed"


class DecodeFlight:
    """The decode in progress for one key. Not thread-safe on its own: every
    method is called with the owning subdomain's lock held."""

    __slots__ = (
        "_cond",
        "_copiers",
        "_error",
        "_state",
        "_value",
        "_waiters",
        "attempts",
        "fingerprint",
    )

    def __init__(self, fingerprint: str, lock: threading.Lock) -> None:
        self.fingerprint = fingerprint
        self.attempts = 1
        self._cond = threading.Condition(lock)
        self._state = FlightState.LEADING
        self._waiters = 0
        self._copiers = 0
        self._error: BaseException | None = None
        self._value: Any = None

    def __repr__(self) -> str:
        return (
            f"DecodeFlight({self.fingerprint}, {self._state.value}, "
            f"waiters={self._waiters}, copiers={self._copiers})"
        )

    @property
    def state(self) -> FlightState:
        return self._state

    @property
    def waiters(self) -> int:
        return self._waiters

    @property
    def copiers(self) -> int:
        """Followers that were waiting at publish time and have not finished copying."""
        return self._copiers

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def value(self) -> Any:
        """The leader's value, held while copiers remain (None before and after).

        Only a copier may use it, and only until it calls :meth:`copied`."""
        return self._value

    def await_outcome(self, deadline: float) -> FlightState | None:
        """Wait while a leader decodes; the new state, or None when ``deadline``
        (``time.monotonic()``) passed first. The caller is no longer a waiter
        once this returns; on PUBLISHED it is a copier and must call
        :meth:`copied` exactly once."""
        self._waiters += 1
        try:
            while self._state is FlightState.LEADING:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return self._state
        except BaseException:
            # interrupted (KeyboardInterrupt) after finish counted us: let go,
            # or the leader would wait for a copy that never comes
            if self._state is FlightState.PUBLISHED:
                self.copied()
            raise
        finally:
            self._waiters -= 1

    def take_lead(self) -> None:
        self._require(FlightState.HANDOFF, "take the lead of")
        self._state = FlightState.LEADING
        self.attempts += 1

    def hand_off(self) -> bool:
        """The leader gives up for its own reason. True when a follower will lead."""
        self._require(FlightState.LEADING, "hand off")
        if not self._waiters:
            return False
        self._state = FlightState.HANDOFF
        self._cond.notify_all()
        return True

    def finish(self, value: Any) -> None:
        """Publish: every follower waiting now becomes a copier of ``value``."""
        self._require(FlightState.LEADING, "publish")
        self._state = FlightState.PUBLISHED
        self._copiers = self._waiters
        self._value = value if self._copiers else None
        self._cond.notify_all()

    def copied(self) -> None:
        """One copier is done with the leader's value (copied, failed, or pinned
        the resident entry instead); the last one drops the flight's reference."""
        if self._copiers <= 0:
            raise LifecycleError(f"{self!r} has no copier left to finish")
        self._copiers -= 1
        if not self._copiers:
            self._value = None
            self._cond.notify_all()

    def await_copies(self) -> None:
        """The leader waits until every copier is done with its value. Unbounded
        on purpose: giving up early would let the value go mid-copy; each copy
        is one bounded device-to-device transfer in the copier's own thread."""
        self._require(FlightState.PUBLISHED, "await the copies of")
        while self._copiers:
            self._cond.wait()

    def fail(self, error: BaseException) -> None:
        self._require(FlightState.LEADING, "fail")
        self._state = FlightState.FAILED
        self._error = error
        self._cond.notify_all()

    def _require(self, state: FlightState, what: str) -> None:
        if self._state is not state:
            raise LifecycleError(f"cannot {what} {self!r}: it is not {state.value}")
