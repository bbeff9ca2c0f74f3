"""The orchestrator: validate, dispatch to a strategy, hash in a fixed order."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from nexus_cache.errors import ProgramCacheKeyError
from nexus_cache.program.keys import _probes
from nexus_cache.program.keys._canon import option_fields, pack
from nexus_cache.program.keys._keymemo import KeyMemo, option_state
from nexus_cache.program.keys._linker import LinkerStrategy
from nexus_cache.program.keys._nvrtc import NvrtcStrategy
from nexus_cache.program.keys._nvvm import NvvmStrategy
from nexus_cache.program.keys._strategy import KeyStrategy

__all__ = [
    "KEY_SCHEMA_VERSION",
    "SUPPORTED_TARGETS",
    "KeyHasher",
    "check_extra_digest",
    "check_types",
    "make_program_cache_key",
    "program_name",
    "strategy_for",
]

#: Bump whenever the key layout or any canonical encoding changes; keys of
#: different schema versions never collide, so old entries simply age out.
KEY_SCHEMA_VERSION = 1

_STRATEGIES: dict[str, KeyStrategy] = {
    s.code_type: s for s in (NvrtcStrategy(), LinkerStrategy(), NvvmStrategy())
}

#: code_type -> the target types ``Program.compile`` accepts for it (cuda.core 1.2).
SUPPORTED_TARGETS: Mapping[str, frozenset[str]] = {ct: s.targets for ct, s in _STRATEGIES.items()}


class KeyHasher:
    """SHA-256 over labelled, length-prefixed fields; no two layouts collide.

    Fields are collected and hashed in one call: on the hit path the key is
    derived on every lookup, and one C-level hash beats a dozen updates.
    """

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def add(self, label: str, payload: bytes) -> None:
        head = _LABELS.get(label)
        if head is None:
            raw = label.encode("ascii")
            head = _LABELS.setdefault(label, len(raw).to_bytes(2, "big") + raw)
        self._parts += (head, len(payload).to_bytes(8, "big"), payload)

    def digest(self) -> bytes:
        # SHA-256: FIPS-approved, so keys work where other hashes are disabled.
        return hashlib.sha256(b"".join(self._parts), usedforsecurity=False).digest()


_LABELS: dict[str, bytes] = {}


def strategy_for(code_type: str) -> KeyStrategy:
    """The key strategy for a (lower-case) code_type."""
    return _STRATEGIES[code_type]


def check_types(code_type: object, target_type: object) -> tuple[str, str]:
    """Lower-case and validate the pair against ``Program.compile``'s matrix."""
    if not isinstance(code_type, str) or code_type.lower() not in _STRATEGIES:
        raise ProgramCacheKeyError(
            f"code_type={code_type!r} is not supported; use one of "
            f"{', '.join(repr(c) for c in _STRATEGIES)}"
        )
    ct = code_type.lower()
    allowed = SUPPORTED_TARGETS[ct]
    if not isinstance(target_type, str) or target_type.lower() not in allowed:
        raise ProgramCacheKeyError(
            f"target_type={target_type!r} is not supported for code_type={ct!r}; "
            f"Program.compile accepts {', '.join(repr(t) for t in sorted(allowed))}"
        )
    return ct, target_type.lower()


def check_extra_digest(extra_digest: object) -> bytes | None:
    """Validate ``extra_digest``: ``None``, or non-empty bytes-like content."""
    if extra_digest is None:
        return None
    if isinstance(extra_digest, (bytes, bytearray, memoryview)):
        data = bytes(extra_digest)
        if not data:
            raise ProgramCacheKeyError(
                "extra_digest must not be empty: b'' proves nothing about the files it "
                "stands for. Pass a digest of their contents, e.g. "
                "hashlib.sha256(header_bytes).digest(), or pass extra_digest=None."
            )
        return data
    raise ProgramCacheKeyError(
        f"extra_digest must be a non-empty bytes-like object (bytes, bytearray or "
        f"memoryview), got {type(extra_digest).__name__} {extra_digest!r}; e.g. "
        "hashlib.sha256(header_bytes).digest() (encode text explicitly)"
    )


def program_name(fields: Mapping[str, Any]) -> str:
    """``options.name`` as ``Program`` uses it (``None`` means ``"default_program"``)."""
    name = fields.get("name")
    return "default_program" if name is None else str(name)


_memo = KeyMemo()


def make_program_cache_key(
    *,
    code: str | bytes | bytearray,
    code_type: str,
    options: Any,
    target_type: str,
    name_expressions: Sequence[str | bytes] = (),
    extra_digest: bytes | bytearray | memoryview | None = None,
) -> bytes:
    """Derive the cache key (32 bytes, SHA-256) of one ``Program`` compile.

    Two calls return the same key exactly when the compiles they describe
    are proven to produce the same binary: same code, same code and target
    type, the same canonical options for the backend that reads them, the
    same name expressions (NVRTC only), the same toolchain build, and the
    same ``extra_digest``.

    Raises :class:`~nexus_cache.errors.ProgramCacheKeyError` (a
    ``ValueError``) when that cannot be proven: an unsupported
    code/target pair; options whose output depends on files the key cannot
    see (include paths, pre-includes, PCH use, NVVM libdevice, an NVRTC
    program name with a directory, a quoted ``#include`` in NVRTC source),
    unless ``extra_digest`` is given; options that write files as a side
    effect (always); an ``extra_digest`` that is empty or not bytes-like.
    Raises ``TypeError`` for a ``code`` or name-expression of the wrong type.

    Pure function of its inputs and the loaded toolchain; thread-safe. A
    repeated call with equal inputs returns the memoized key after comparing
    the options field by field (see ``keys/_keymemo.py``): the same proof, at a
    fraction of the cost.
    """
    state = option_state(options)
    mk = None
    if state is not None and not isinstance(name_expressions, (str, bytes, bytearray)):
        try:
            mk = (
                KEY_SCHEMA_VERSION,
                code,
                code_type,
                target_type,
                tuple(name_expressions),
                extra_digest,
                type(options),
            )
            hash(mk)
        except TypeError:  # unhashable inputs (a bytearray, a memoryview): derive
            mk = None
        else:
            found = _memo.get(mk, state)
            if found is not None:
                return found
    generation = _probes.generation()
    key = _derive(code, code_type, options, target_type, name_expressions, extra_digest)
    if mk is not None and state is not None:
        _memo.put(mk, state, key, generation)
    return key


def _derive(
    code: str | bytes | bytearray,
    code_type: str,
    options: Any,
    target_type: str,
    name_expressions: Sequence[str | bytes],
    extra_digest: bytes | bytearray | memoryview | None,
) -> bytes:
    ct, tt = check_types(code_type, target_type)
    strategy = _STRATEGIES[ct]
    digest = check_extra_digest(extra_digest)
    fields = option_fields(options)
    code_bytes = strategy.encode_code(code)
    strategy.validate(fields, code_bytes, has_extra_digest=digest is not None)
    fingerprint = strategy.option_fingerprint(fields)
    names = strategy.encode_name_expressions(name_expressions)

    h = KeyHasher()
    h.add("schema", str(KEY_SCHEMA_VERSION).encode())
    h.add("backend", strategy.backend.encode())
    h.add("frontend", _probes.frontend_identity())
    h.add("toolchain", strategy.version_probe())
    h.add("code_type", ct.encode())
    h.add("target_type", tt.encode())
    h.add("code", code_bytes)
    h.add("options", pack([pack([n.encode(), v]) for n, v in fingerprint]))
    if names is not None:
        h.add("names", pack(list(names)))
    for label, payload in strategy.extra_payload(fields):
        h.add(f"extra:{label}", payload)
    h.add("program_name", program_name(fields).encode("utf-8", "surrogatepass"))
    h.add("extra_digest", b"" if digest is None else b"\x01" + digest)
    return h.digest()
