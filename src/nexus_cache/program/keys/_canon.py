"""Canonical byte encodings of ``ProgramOptions`` values.

Each canonicalizer maps a field's value to the bytes that stand for what the
compiler will actually receive, or to ``None`` when the compiler receives
nothing for it. Spellings that produce the same compiler input encode equal
(``["a"]``, ``("a",)`` and ``"a"``; ``debug=False`` and ``debug=None``;
``max_register_count=32`` and ``"32"``); spellings that produce different
input encode differently (``ftz=False`` emits ``--ftz=false``, so it differs
from ``ftz=None``). Order inside sequences is kept: compilers honour flag
order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nexus_cache.errors import ProgramCacheKeyError

__all__ = [
    "Canonicalizer",
    "flag",
    "generic",
    "int_seq",
    "macros",
    "option_fields",
    "pack",
    "scalar",
    "str_seq",
    "tristate",
]

Canonicalizer = Callable[[str, Any], "bytes | None"]

_FIELD_CACHE: dict[type, tuple[str, ...]] = {}


def pack(items: Sequence[bytes]) -> bytes:
    """Length-prefixed concatenation: no two item lists pack to the same bytes."""
    return b"".join(len(item).to_bytes(4, "big") + item for item in items)


def _text(value: Any) -> bytes:
    # f-string formatting is what cuda.core uses to build each flag, so
    # ``str()`` reproduces the flag text exactly (``True`` -> ``"True"``).
    return str(value).encode("utf-8", "surrogatepass")


def flag(_name: str, value: Any) -> bytes | None:
    """A switch emitted only when truthy (``--device-debug``)."""
    return b"1" if value else None


def tristate(_name: str, value: Any) -> bytes | None:
    """A switch emitted as on/off whenever it is set (``--ftz=true|false``)."""
    if value is None:
        return None
    return b"1" if value else b"0"


def scalar(_name: str, value: Any) -> bytes | None:
    """A value emitted as ``--flag=<value>`` whenever it is set."""
    return None if value is None else _text(value)


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray))


def str_seq(_name: str, value: Any) -> bytes | None:
    """One string or a sequence of strings, one flag each; empty means unset."""
    if value is None:
        return None
    if isinstance(value, str):
        return pack([_text(value)])
    if _is_sequence(value):
        return pack([_text(v) for v in value]) if len(value) else None
    return None  # cuda.core emits nothing for other shapes


def int_seq(_name: str, value: Any) -> bytes | None:
    """One number or a sequence of them (diagnostic ids); empty means unset."""
    if value is None:
        return None
    if isinstance(value, int):
        return pack([_text(value)])
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        # A str is a sequence of characters here, exactly as the compiler
        # front end iterates it.
        return pack([_text(v) for v in value]) if len(value) else None
    return None


def _macro(name: str, item: Any) -> bytes:
    if isinstance(item, str):
        return _text(item)
    if (
        isinstance(item, (tuple, list))
        and len(item) == 2
        and all(isinstance(part, str) for part in item)
    ):
        # ("N", "V") and "N=V" both become --define-macro=N=V.
        return _text(f"{item[0]}={item[1]}")
    raise ProgramCacheKeyError(
        f"option {name}={item!r} is not a macro: use 'NAME', 'NAME=VALUE', "
        "('NAME', 'VALUE') or a list of those"
    )


def macros(name: str, value: Any) -> bytes | None:
    """``define_macro``: a name, a (name, value) pair, or a sequence of those."""
    if value is None:
        return None
    if isinstance(value, str):
        return pack([_macro(name, value)])
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return pack([_macro(name, value)])  # a lone pair, not two macros
    if _is_sequence(value):
        return pack([_macro(name, item) for item in value]) if len(value) else None
    raise ProgramCacheKeyError(
        f"option {name}={value!r} is not a macro: use 'NAME', 'NAME=VALUE', "
        "('NAME', 'VALUE') or a list of those"
    )


def generic(name: str, value: Any) -> bytes | None:
    """Type-tagged encoding for fields no table knows (fail closed: they count).

    Only plain data is accepted; anything else is refused rather than
    encoded through ``repr`` (which may embed addresses and change per run).
    """
    if value is None:
        return None
    return _tagged(name, value)


def _tagged(name: str, value: Any) -> bytes:
    if isinstance(value, bool):
        return b"b" + (b"1" if value else b"0")
    if isinstance(value, int):
        return b"i" + _text(value)
    if isinstance(value, float):
        return b"f" + value.hex().encode()
    if isinstance(value, str):
        return b"s" + _text(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return b"y" + bytes(value)
    if value is None:
        return b"n"
    if isinstance(value, Mapping):
        items = sorted((_tagged(name, k), _tagged(name, v)) for k, v in value.items())
        return b"m" + pack([pack([k, v]) for k, v in items])
    if _is_sequence(value):
        return b"l" + pack([_tagged(name, v) for v in value])
    raise ProgramCacheKeyError(
        f"option {name}={value!r} has type {type(value).__name__}, which the key cannot "
        "fingerprint; use str, int, float, bool, bytes or sequences of those"
    )


def option_fields(options: Any) -> dict[str, Any]:
    """Field name -> value of the *set* (non-``None``) fields of a ``ProgramOptions``.

    Accepts any dataclass instance or a mapping of field names to values.
    """
    if options is None:
        raise ProgramCacheKeyError(
            "options is required to derive a program cache key: pass "
            "ProgramOptions(arch='sm_XX', ...) (the key needs an explicit arch)"
        )
    if isinstance(options, Mapping):
        return {n: v for n, v in options.items() if v is not None}
    cls = type(options)
    names = _FIELD_CACHE.get(cls)
    if names is None:
        if not dataclasses.is_dataclass(options):
            raise TypeError(
                "options must be a cuda.core ProgramOptions (or a mapping of its field "
                f"names to values), got {cls.__name__}"
            )
        names = tuple(f.name for f in dataclasses.fields(options))
        _FIELD_CACHE[cls] = names
    # Unset (None) fields are dropped here: every canonicalizer maps None to
    # "not emitted", and most of the ~55 fields are unset, so this keeps key
    # derivation on the hit path cheap.
    attrs = getattr(options, "__dict__", None)
    if attrs is not None:
        try:
            return {n: v for n in names if (v := attrs[n]) is not None}
        except KeyError:
            pass  # a slotted or property-backed field: fall back to getattr
    return {n: v for n in names if (v := getattr(options, n)) is not None}
