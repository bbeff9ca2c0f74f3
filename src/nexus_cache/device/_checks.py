"""Validation of byte counts passed at run time (not settings: those are ``ConfigError``)."""

from __future__ import annotations

from nexus_cache.errors import ByteCountError

__all__ = ["check_byte_count"]


def check_byte_count(name: str, value: object) -> int:
    """Return ``value`` if it is an ``int >= 0`` (``bool`` refused), else raise
    :class:`ByteCountError` naming the argument. Pure function: thread-safe."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ByteCountError(f"{name}={value!r} is not a byte count; pass an int >= 0")
    return value
