"""The one byte-size grammar and the one size formatter of the whole package.

Every option and environment variable that takes a size goes through
:func:`parse_size`, and every size printed goes through :func:`format_size`,
so the CLI, the lakehouse settings and the device profiles agree.

Grammar (case-insensitive, ASCII digits only, optional spaces and ``B``):

* ``1048576``: plain bytes;
* ``64K``, ``64M``, ``10G``, ``1T`` and ``64KiB`` ... ``1TiB``: powers of 1024;
* ``500KB``, ``500MB``, ``10GB``, ``1TB``: powers of 1000.

Plain bytes are accepted as ``int`` too (``bool`` is refused).
"""

from __future__ import annotations

import re

from nexus_cache.errors import ConfigError

__all__ = ["SIZE_GRAMMAR", "format_size", "parse_size"]

SIZE_GRAMMAR = (
    "a whole number of bytes, optionally with a unit: K, M, G, T or KiB, MiB, GiB, TiB "
    "(powers of 1024), or KB, MB, GB, TB (powers of 1000); e.g. 1048576, 64M, 10GiB"
)

_BINARY = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
# [0-9], not \d: \d also matches Arabic-Indic and other Unicode digits.
_SIZE_RE = re.compile(r"\s*([0-9]+)\s*(?:([kmgt]?)(i?)(b?))\s*", re.IGNORECASE)


def parse_size(value: str | int, *, name: str, allow_zero: bool = False) -> int:
    """Parse ``value`` to a byte count, or raise :class:`ConfigError` naming ``name``.

    ``name`` is the setting, variable or option being parsed; the message
    gives it, the value and :data:`SIZE_GRAMMAR`. Zero is refused unless
    ``allow_zero`` (for settings where ``0`` means something, such as "off").
    Pure function: thread-safe.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{name}={value!r} is not a byte size; use {SIZE_GRAMMAR}")
    if isinstance(value, int):
        number = value
    else:
        match = _SIZE_RE.fullmatch(value)
        if match is None:
            raise ConfigError(f"{name}={value!r} is not a byte size; use {SIZE_GRAMMAR}")
        digits, prefix, binary, byte = match.groups()
        prefix = prefix.lower()
        if binary and not prefix:  # "12iB" or "12i"
            raise ConfigError(f"{name}={value!r} is not a byte size; use {SIZE_GRAMMAR}")
        if binary and not byte:  # "64Mi": say MiB or M
            raise ConfigError(f"{name}={value!r} is not a byte size; use {SIZE_GRAMMAR}")
        decimal = bool(prefix) and bool(byte) and not binary
        number = int(digits) * (_DECIMAL[prefix] if decimal else _BINARY[prefix])
    if number < (0 if allow_zero else 1):
        need = "a byte size >= 0" if allow_zero else "a positive byte size"
        raise ConfigError(f"{name}={value!r} must be {need}; use {SIZE_GRAMMAR}")
    return number


def format_size(nbytes: int | float) -> str:
    """``1536`` -> ``'1.5 KiB'``: IEC units, one decimal, plain bytes below 1 KiB."""
    size = float(nbytes)
    if abs(size) < 1024:
        return f"{int(nbytes)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.1f} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover
