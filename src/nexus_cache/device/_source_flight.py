"""Single flight for one cold source key: one decode leader, followers waiting.

A :class:`DecodeFlight` belongs to the source subdomain that created it and
is only touched with that subdomain's lock held (its condition shares the
lock). States::

    LEADING --finish--> PUBLISHED            (followers check out or copy)
       |  \\--fail----> FAILED               (every follower gets the error)
       \\--hand_off--> HANDOFF --take_lead--> LEADING   (a follower leads)
"""

from __future__ import annotations

import enum
import threading
import time
from typing import Any

from nexus_cache.errors import LifecycleError

__all__ = ["DecodeFlight", "FlightState"]


class FlightState(enum.Enum):
    LEADING = "leading"
    HANDOFF = "handoff"
    PUBLISHED = "published"
    FAILED = "failed"


class DecodeFlight:
    """The decode in progress for one key. Not thread-safe on its own: every
    method is called with the owning subdomain's lock held."""

    __slots__ = ("_cond", "_error", "_state", "_value", "_waiters", "attempts", "fingerprint")

    def __init__(self, fingerprint: str, lock: threading.Lock) -> None:
        self.fingerprint = fingerprint
        self.attempts = 1
        self._cond = threading.Condition(lock)
        self._state = FlightState.LEADING
        self._waiters = 0
        self._error: BaseException | None = None
        self._value: Any = None

    def __repr__(self) -> str:
        return f"DecodeFlight({self.fingerprint}, {self._state.value}, waiters={self._waiters})"

    @property
    def state(self) -> FlightState:
        return self._state

    @property
    def waiters(self) -> int:
        return self._waiters

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def value(self) -> Any:
        """The leader's own value once PUBLISHED (followers copy it if not retained)."""
        return self._value

    def await_outcome(self, deadline: float) -> FlightState | None:
        """Wait while a leader decodes; the new state, or None when ``deadline``
        (``time.monotonic()``) passed first. The caller is no longer a waiter
        once this returns."""
        self._waiters += 1
        try:
            while self._state is FlightState.LEADING:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return self._state
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
        self._require(FlightState.LEADING, "publish")
        self._state = FlightState.PUBLISHED
        self._value = value
        self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        self._require(FlightState.LEADING, "fail")
        self._state = FlightState.FAILED
        self._error = error
        self._cond.notify_all()

    def _require(self, state: FlightState, what: str) -> None:
        if self._state is not state:
            raise LifecycleError(f"cannot {what} {self!r}: it is not {state.value}")
