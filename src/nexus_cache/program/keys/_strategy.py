"""The per-backend key strategy: what one compiler reads, and how to prove it.

A strategy owns, for one ``code_type``: input validation and refusals, code
encoding, the canonical option fingerprint, name-expression encoding, the
toolchain version probe and any extra payload. The orchestrator
(:mod:`._derive`) only dispatches and hashes.

Option tables are explicit. Every ``ProgramOptions`` field is in exactly one
of: ``relevant`` (fingerprinted with its canonicalizer), ``ignored`` (known
not to reach this backend, so it never perturbs the key), ``invalid``
(``Program`` rejects it for this backend), or none of them. A field in none
of them (one a newer ``cuda.core`` added) is fingerprinted generically: an
unknown field may cost a spurious miss, never a wrong hit.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from nexus_cache.errors import ProgramCacheKeyError
from nexus_cache.program.keys._canon import Canonicalizer, generic

__all__ = ["KeyStrategy", "refuse_external", "refuse_side_effect"]

# Fields the orchestrator hashes itself, for every backend.
_UNIVERSAL = frozenset({"name"})


def _show(fields: Mapping[str, Any], names: Sequence[str]) -> str:
    return ", ".join(f"{n}={fields.get(n)!r}" for n in names)


def refuse_external(fields: Mapping[str, Any], names: Sequence[str], why: str) -> None:
    """Raise for options whose output depends on files the key cannot see."""
    shown = _show(fields, names)
    raise ProgramCacheKeyError(
        f"cannot derive a program cache key for option {shown}: {why}, and the key "
        "cannot see those files' contents. Pass extra_digest=<non-empty bytes, e.g. a "
        "SHA-256 over every file the compile may read> to make_program_cache_key or "
        f"cached_compile, or unset {', '.join(names)}."
    )


def refuse_side_effect(shown: str, names: Sequence[str]) -> None:
    """Raise for options that write output outside the returned binary."""
    raise ProgramCacheKeyError(
        f"cannot cache a compile with option {shown}: it writes output outside the "
        "compiled binary, which a cache hit would silently skip. Unset "
        f"{', '.join(names)} to cache this compile, or compile without the cache "
        "(extra_digest does not lift this refusal)."
    )


class KeyStrategy(abc.ABC):
    """Key derivation rules of one compiler backend. Stateless; thread-safe."""

    #: label mixed into the key, e.g. ``"nvrtc"``
    backend: ClassVar[str]
    #: the ``Program`` code_type this strategy serves
    code_type: ClassVar[str]
    #: target types ``Program.compile`` accepts for that code_type
    targets: ClassVar[frozenset[str]]
    #: field -> canonicalizer, for every field this backend reads
    relevant: ClassVar[Mapping[str, Canonicalizer]]
    #: fields known to be dropped on the way to this backend
    ignored: ClassVar[frozenset[str]] = frozenset()
    #: field -> reason, for fields ``Program`` rejects with this backend
    invalid: ClassVar[Mapping[str, str]] = {}
    #: relevant fields whose output depends on external files (need extra_digest)
    external: ClassVar[Mapping[str, str]] = {}
    #: relevant fields that write files as a side effect (always refused)
    side_effects: ClassVar[tuple[str, ...]] = ()

    # -- validation -------------------------------------------------------------
    def validate(self, fields: Mapping[str, Any], code: bytes, *, has_extra_digest: bool) -> None:
        """Refuse inputs the key cannot prove; see the module docstring for the rules."""
        effects = self.side_effect_options(fields)
        if effects:
            shown = ", ".join(f"{n}={v!r}" for n, v in effects)
            refuse_side_effect(shown, [n for n, _ in effects])
        for name, reason in self.invalid.items():
            if name in fields:
                raise ProgramCacheKeyError(
                    f"option {name}={fields[name]!r} is not valid for code_type="
                    f"{self.code_type!r}: {reason}; unset it"
                )
        if fields.get("arch") is None:
            raise ProgramCacheKeyError(
                "options.arch is required to derive a program cache key: set "
                "ProgramOptions(arch='sm_XX') explicitly"
            )
        if not has_extra_digest:
            for name, why in self.external.items():
                value = fields.get(name)
                if value is not None and self.relevant[name](name, value) is not None:
                    refuse_external(fields, [name], why)
            self.validate_sources(fields, code)

    def side_effect_options(self, fields: Mapping[str, Any]) -> list[tuple[str, Any]]:
        """``(field, value)`` of every set option that writes files as a side effect."""
        found = []
        for n in self.side_effects:
            value = fields.get(n)
            if value is not None and self.relevant[n](n, value) is not None:
                found.append((n, value))
        return found

    def validate_sources(self, fields: Mapping[str, Any], code: bytes) -> None:  # noqa: B027
        """Backend-specific refusals for implicit file dependencies. Default: none."""

    # -- encodings ----------------------------------------------------------------
    @abc.abstractmethod
    def encode_code(self, code: object) -> bytes:
        """The program text as bytes, exactly as the backend receives it."""

    def option_fingerprint(self, fields: Mapping[str, Any]) -> list[tuple[str, bytes]]:
        """Sorted ``(field, canonical bytes)`` for every field that reaches the backend."""
        out = []
        for name, value in fields.items():
            if name in _UNIVERSAL or name in self.ignored or name in self.invalid:
                continue
            canon = self.relevant.get(name)
            encoded = canon(name, value) if canon is not None else generic(name, value)
            if encoded is not None:
                tag = name if canon is not None else f"unknown:{name}"
                out.append((tag, encoded))
        out.sort()
        return out

    def encode_name_expressions(self, names: Sequence[str | bytes]) -> tuple[bytes, ...] | None:
        """Tagged, sorted name expressions, or ``None`` if the backend ignores them."""
        return None

    @abc.abstractmethod
    def version_probe(self) -> bytes:
        """Toolchain identity; fails closed but stable (see :mod:`._probes`)."""

    def extra_payload(self, fields: Mapping[str, Any]) -> list[tuple[str, bytes]]:
        """Further ``(label, bytes)`` inputs this backend reads. Default: none."""
        return []
