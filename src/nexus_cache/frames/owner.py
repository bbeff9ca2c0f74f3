"""``FrameOwner``: keeps something (a cache pin) alive while frames depend on it."""

from __future__ import annotations

import threading
from collections.abc import Callable

from nexus_cache.errors import LifecycleError

__all__ = ["FrameOwner"]


class FrameOwner:
    """A reference count shared by a frame and every frame derived from it.

    Each frame that holds the owner counts once, from its creation until its
    :meth:`DeviceFrame.release` (or its garbage collection, as a safety net).
    When the count returns to zero ``on_release`` runs, exactly once: a
    source-cache hit passes its pin's ``release`` there, so the resident entry
    stays pinned until the last dependent frame is released. ``keepalive`` is
    held until then too. Thread-safe.
    """

    __slots__ = ("_keepalive", "_lock", "_on_release", "_refs", "_released")

    def __init__(
        self, on_release: Callable[[], object] | None = None, keepalive: object = None
    ) -> None:
        self._on_release = on_release
        self._keepalive = keepalive
        self._lock = threading.Lock()
        self._refs = 0
        self._released = False

    def __repr__(self) -> str:
        return f"FrameOwner(refs={self._refs}, released={self._released})"

    @property
    def refs(self) -> int:
        """Frames holding the owner now."""
        return self._refs

    @property
    def released(self) -> bool:
        """True once the last holder let go and ``on_release`` ran."""
        return self._released

    @property
    def keepalive(self) -> object:
        return self._keepalive

    def acquire(self) -> None:
        """Count one more holder; refused once released."""
        with self._lock:
            if self._released:
                raise LifecycleError(
                    "this frame owner was already released (its last frame let go); "
                    "check the source out again"
                )
            self._refs += 1

    def release(self) -> None:
        """Count one holder less; the last one runs ``on_release``."""
        with self._lock:
            if self._refs <= 0:
                raise LifecycleError("frame owner released more often than acquired")
            self._refs -= 1
            if self._refs:
                return
            self._released = True
            callback, self._on_release = self._on_release, None
            self._keepalive = None
        if callback is not None:
            callback()
