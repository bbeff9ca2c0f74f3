"""``SourceClaim``: the decode lead for one source key, and how it is resolved.

The source cache hands a claim to exactly one caller per cold key (see
``source_cache.py``). The claim resolves once: publish, fail, or abandon;
the cache's :class:`ClaimOutcomes` say what each does to the flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
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
    from nexus_cache.device._source_flight import DecodeFlight
    from nexus_cache.device.source_key import SourceFrameKey
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

    #: ``(flight, key, value, started) -> (retained, detail)``
    publish: Callable[[DecodeFlight, SourceFrameKey, Any, float], tuple[bool, str]]
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

    def publish(self, value: DeviceValue) -> SourceCheckout:
        """Offer the decoded ``value`` to the cache and wake the followers.

        Returns the leader's checkout of its own ``value`` (no pin). Never
        fails for capacity: when the value cannot be retained the diagnostics
        say why. Returns only once every follower waiting now has its own
        copy (or a pin on the resident entry), so the caller may release
        ``value`` as soon as it has it back.
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
        retained, detail = self._outcomes.publish(self._flight, key, value, self._started)
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
