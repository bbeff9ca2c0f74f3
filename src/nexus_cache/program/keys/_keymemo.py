"""Memoized key derivations: a repeated lookup costs a comparison, not a derivation.

A key is a pure function of the compile inputs and of the loaded toolchain
(probed once per process). So a value derived once can be reused for as
long as every input is *equal* to what it was derived from:

* the hashable inputs (code, types, target, names, ``extra_digest``, the
  object a value was derived for) form the memo key;
* the options are compared by value *and type* on every lookup: their
  fields are snapshotted at derivation, and a list or tuple value is
  snapshotted as an immutable copy, so a list mutated in place is noticed;
  any other non-plain value (an object that could change behind our back)
  disables the memo for those inputs. Types count because Python's equality
  does not see them while the compiler's flags do: ``False == 0`` and
  ``32 == 32.0``, but cuda.core emits ``--split-compile=False`` (refused by
  NVRTC) for one and ``--split-compile=0`` for the other, and
  ``--maxrregcount=32.0`` for a float;
* the toolchain probe generation must be unchanged (see
  ``clear_probe_cache``).

The proof of identity is therefore exactly the derivation's: a lookup
returns what deriving again would return. Bounded (cleared when full);
thread-safe (dict operations are atomic and entries are immutable).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from nexus_cache.program.keys import _probes

__all__ = ["KeyMemo", "option_state"]

_PLAIN = (str, bytes, int, float, bool, type(None))
_PLAIN_TYPES = frozenset(_PLAIN)
_UNUSABLE = object()


def _frozen(value: Any) -> Any:
    """An immutable, type-tagged copy of an option value, or ``_UNUSABLE``.

    Every item carries its exact type, so ``[1]``, ``[True]`` and ``[1.0]``
    (equal in Python, different flags for the compiler) never compare equal.
    """
    cls = value.__class__
    if cls in _PLAIN_TYPES:
        return (cls, value)
    if cls is list or cls is tuple:
        items = tuple(_frozen(v) for v in value)
        return _UNUSABLE if any(v is _UNUSABLE for v in items) else (cls, items)
    return _UNUSABLE


def option_state(options: Any) -> dict[str, Any] | None:
    """The live field mapping of ``options`` (a dict, or a dataclass's ``__dict__``)."""
    if type(options) is dict:
        return options
    state = getattr(options, "__dict__", None)
    return state if type(state) is dict else None


class KeyMemo:
    """``memo key -> value`` where each entry also pins an options snapshot."""

    __slots__ = ("_entries", "_max")

    def __init__(self, maxsize: int = 256) -> None:
        self._entries: dict[Hashable, tuple[Any, ...]] = {}
        self._max = maxsize

    def get(self, mk: Hashable, state: dict[str, Any]) -> Any:
        """The value stored under ``mk`` if ``state`` still equals its snapshot, else ``None``."""
        found = self._entries.get(mk)
        if (
            found is not None
            and found[2] == _probes.generation()
            and found[0] == state
            and list(map(type, map(state.__getitem__, found[4]))) == found[5]
            and all(_frozen(state.get(n)) == v for n, v in found[1])
        ):
            return found[3]
        return None

    def put(self, mk: Hashable, state: dict[str, Any], value: Any, generation: int) -> None:
        """Remember ``value``; ``generation`` is the probe generation read *before* deriving it."""
        # Most of ~55 option fields are None: a type lookup per field, then
        # the (rare) list values snapshotted.
        if _PLAIN_TYPES.issuperset(map(type, state.values())):
            mutable: tuple[tuple[str, Any], ...] = ()  # the common case, checked in C
        else:
            mutable = tuple(
                (n, _frozen(v)) for n, v in state.items() if v.__class__ not in _PLAIN_TYPES
            )
        if any(v is _UNUSABLE for _, v in mutable):
            return  # a value we cannot snapshot: derive every time
        # The exact type of every set field: equal values of other types
        # (0 and False, 32 and 32.0) are other flags. Unset (None) fields need
        # no check: only None equals None among plain values.
        # (Compared through C-level maps: this runs on every memo hit.)
        names = tuple(n for n, v in state.items() if v is not None)
        types = [type(state[n]) for n in names]
        if len(self._entries) >= self._max:
            self._entries.clear()
        self._entries[mk] = (dict(state), mutable, generation, value, names, types)

    def clear(self) -> None:
        self._entries.clear()
