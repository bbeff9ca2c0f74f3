"""Metadata kept beside a cached binary: NVRTC's lowered names and the object name.

A cache entry stays the raw binary (cuobjdump can read it); what the binary
cannot carry, the ``ObjectCode.symbol_mapping`` that NVRTC fills from
``name_expressions`` and, for keys derived without seeing the options, the
object's name, lives in a small JSON document stored in the *same* cache
resource under :func:`sidecar_key` ``(key)``.

The document pins the SHA-256 of the binary it describes. A hit whose
sidecar is missing, unreadable, or describes other bytes (a writer replaced
one half of the pair) is treated as a miss: the caller recompiles and
rewrites both. Nothing here is ever unpickled; the JSON is validated field
by field.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SIDECAR_SUFFIX", "EntryMeta", "decode_meta", "encode_meta", "sidecar_key"]

#: appended to a binary's key to form its sidecar's key
SIDECAR_SUFFIX = b".nexus-meta.v1"
_FORMAT = "nexus-cache/program-meta"
_VERSION = 1

SymbolMapping = dict[str | bytes, bytes | str | None]


def sidecar_key(key: bytes) -> bytes:
    """The cache key of ``key``'s metadata document."""
    return key + SIDECAR_SUFFIX


@dataclass(frozen=True)
class EntryMeta:
    """What a hit needs to rebuild the ``ObjectCode`` a fresh compile returns."""

    name: str
    symbol_mapping: SymbolMapping


def _enc(value: object) -> list[str]:
    # Symbol keys keep their type (str vs bytes: get_kernel matches on it);
    # bytes travel as latin-1 text, a lossless byte<->char mapping.
    if isinstance(value, str):
        return ["s", value]
    if isinstance(value, (bytes, bytearray)):
        return ["b", bytes(value).decode("latin-1")]
    if value is None:
        return ["n", ""]
    raise TypeError(f"symbol mapping holds a {type(value).__name__}; expected str or bytes")


def _dec(item: Any) -> str | bytes | None:
    if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)):
        raise ValueError("malformed symbol")
    tag, text = item
    if tag == "s":
        return text
    if tag == "b":
        return text.encode("latin-1")
    if tag == "n" and text == "":
        return None
    raise ValueError("unknown symbol tag")


def encode_meta(
    binary: bytes, target_type: str, name: str, symbol_mapping: Mapping[Any, Any]
) -> bytes:
    """The sidecar document for ``binary`` (deterministic JSON, UTF-8)."""
    doc = {
        "format": _FORMAT,
        "version": _VERSION,
        "binary_sha256": hashlib.sha256(binary).hexdigest(),
        "target_type": target_type,
        "name": name,
        "symbols": sorted([_enc(k), _enc(v)] for k, v in symbol_mapping.items()),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")


def decode_meta(raw: bytes, binary: bytes, target_type: str) -> EntryMeta | None:
    """Parse and check a sidecar; ``None`` unless it describes exactly ``binary``."""
    try:
        doc = json.loads(bytes(raw).decode("utf-8"))
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
            return None
        if doc.get("version") != _VERSION or doc.get("target_type") != target_type:
            return None
        if doc.get("binary_sha256") != hashlib.sha256(binary).hexdigest():
            return None
        name = doc.get("name")
        symbols = doc.get("symbols")
        if not isinstance(name, str) or not isinstance(symbols, list):
            return None
        mapping: SymbolMapping = {}
        for pair in symbols:
            if not (isinstance(pair, list) and len(pair) == 2):
                return None
            key = _dec(pair[0])
            if key is None:
                return None
            mapping[key] = _dec(pair[1])
    except (ValueError, UnicodeDecodeError, RecursionError):
        # RecursionError: json gives up on deeply nested arrays; such a
        # document is unreadable like any other, i.e. a miss
        return None
    return EntryMeta(name=name, symbol_mapping=mapping)
