"""Strict text-to-number parsing for settings (variables, TOML strings, options).

Python's ``int()`` and ``float()`` accept more than a setting should:
underscores (``1_000``) and any Unicode decimal digit (Arabic-Indic one and zero read as 10), so
a value that looks like garbage in a terminal would be silently used. Every
numeric setting that is not a byte size (those go through
:mod:`nexus_cache._sizes`) parses its text here; a timeout passed at run time
(``shutdown(timeout=...)``) is checked by :func:`check_timeout`. Pure
functions: thread-safe.
"""

from __future__ import annotations

import math
import re
import threading

from nexus_cache.errors import ConfigError

__all__ = ["check_timeout", "parse_float_text", "parse_int_text"]

# [0-9], not \d: \d also matches Arabic-Indic and other Unicode digits.
_INT_RE = re.compile(r"\s*[+-]?[0-9]+\s*")
_FLOAT_RE = re.compile(
    r"\s*[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|nan|inf|infinity)\s*",
    re.IGNORECASE,
)


def parse_int_text(text: str) -> int:
    """``" 12 "`` -> ``12``; raises ``ValueError`` for anything but ASCII digits and a sign."""
    if not _INT_RE.fullmatch(text):
        raise ValueError(f"not a whole number: {text!r}")
    return int(text)


def parse_float_text(text: str) -> float:
    """``"1.5"`` -> ``1.5``; ASCII decimal or exponent notation only (``nan``/``inf`` parse:
    callers refuse them with a message naming their setting)."""
    if not _FLOAT_RE.fullmatch(text):
        raise ValueError(f"not a number: {text!r}")
    return float(text)


def check_timeout(what: str, value: object) -> float:
    """``value`` as seconds to wait: a finite ``int`` or ``float`` >= 0 (``bool``
    refused), else :class:`ConfigError` naming ``what``. A value beyond the longest
    wait Python's threads accept (``threading.TIMEOUT_MAX``, about 292 years) is
    that longest wait: the same in effect, where waiting for it would overflow."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ConfigError(f"{what}={value!r} is not accepted; use a finite number of seconds >= 0")
    return min(float(value), threading.TIMEOUT_MAX)
