"""Single flight for one cold source key: one decode leader, followers waiting.

A :class:`DecodeFlight` belongs to the source subdomain that created it and
is only touched with that subdomain's lock held (its condition shares the
lock). States::

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
