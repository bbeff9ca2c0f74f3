"""Validation of the size and count caps every program cache backend accepts."""

from __future__ import annotations

import logging

from nexus_cache._sizes import parse_size
from nexus_cache.errors import ConfigError

__all__ = ["log_oversize", "validate_cap"]

_log = logging.getLogger("nexus_cache.program")


def validate_cap(name: str, value: object) -> int | None:
    """Return ``value`` as a positive int cap, or ``None`` for no cap.

    A byte cap (``name`` ending in ``_bytes``) given as a string reads the
    package's one size grammar (``"64M"``, ``"10GiB"``), as every size
    setting does (docs/configuration.md).
    """
    if value is None:
        return None
    if isinstance(value, str) and name.endswith("_bytes"):
        return parse_size(value, name=name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"{name} must be a positive int or None (no cap), got {value!r} "
            f"of type {type(value).__name__}"
        )
    if value <= 0:
        raise ConfigError(
            f"{name} must be a positive int or None (no cap), got {value}; "
            "to disable caching, do not pass a cache at all"
        )
    return value


def log_oversize(cache: object, size: int, cap: int) -> None:
    _log.info(
        "%s: entry of %d bytes is larger than max_size_bytes=%d; not stored "
        "(counted in stats().oversize). Raise max_size_bytes to cache it.",
        type(cache).__name__,
        size,
        cap,
    )
