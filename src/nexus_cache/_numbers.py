"""Strict text-to-number parsing for settings (variables, TOML strings, options).

Python's ``int()`` and ``float()`` accept more than a setting should:
underscores (``1_000``) and any Unicode decimal digit (Arabic-Indic one and zero read as 10), so
a value that looks like garbage in a terminal would be silently used. Every
numeric setting that is not a byte size (those go through
:mod:`nexus_cache._sizes`) parses its text here. Pure functions: thread-safe.
"""

from __future__ import annotations

import re

__all__ = ["parse_float_text", "parse_int_text"]

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
