"""Keys for a plain ``cuda.core.Program``, whose source Python cannot read.

``Program`` keeps its code and options in C-level fields. What it does
expose is ``Program.compile(cache=...)``, which derives cuda.core's own key
from those fields and then asks the cache for it. A capturing resource
answers that first ``get`` by raising, so the compile stops before NVRTC
runs and the key comes back to us. The nexus key then hashes that peer key
together with our own toolchain identity (finer than the peer's
``major.minor``), the target type, the name expressions and
``extra_digest``.

The peer's refusal rules apply (include paths, PCH, libdevice, a program
name with a directory); our source scan for quoted ``#include`` cannot,
because the source is invisible. Use ``CompileInputs`` or
``CacheableProgram`` for the full rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nexus_cache.errors import ProgramCacheKeyError
from nexus_cache.program.keys import _probes
from nexus_cache.program.keys._canon import pack
from nexus_cache.program.keys._derive import (
    KEY_SCHEMA_VERSION,
    KeyHasher,
    check_extra_digest,
    check_types,
    strategy_for,
)

__all__ = ["delegated_key", "peer_code_type"]

_BACKEND_CODE_TYPE = {"NVRTC": "c++", "NVVM": "nvvm", "nvJitLink": "ptx", "driver": "ptx"}


class _KeyCaptured(BaseException):
    # BaseException: must pass through any ``except Exception`` on the way out
    # of Program.compile.
    def __init__(self, key: bytes) -> None:
        super().__init__()
        self.key = key


_capture_cls: type | None = None


def _capture_resource() -> Any:
    global _capture_cls
    if _capture_cls is None:
        from cuda.core.utils import ProgramCacheResource as PeerResource

        class _Capture(PeerResource):
            def get(self, key: Any, default: Any = None) -> Any:
                raise _KeyCaptured(bytes(key))

            def __getitem__(self, key: Any) -> Any:
                raise _KeyCaptured(bytes(key))

            def __setitem__(self, key: Any, value: Any) -> None:
                raise _KeyCaptured(bytes(key))

            def __delitem__(self, key: Any) -> None:
                raise KeyError(key)

            def __len__(self) -> int:
                return 0

            def clear(self) -> None:
                pass

        _capture_cls = _Capture
    return _capture_cls()


def peer_code_type(program: Any) -> str:
    """The code_type a ``Program`` was built for, from its public ``backend``."""
    backend = str(getattr(program, "backend", ""))
    try:
        return _BACKEND_CODE_TYPE[backend]
    except KeyError:
        raise TypeError(
            f"cannot tell the code type of a Program with backend {backend!r}"
        ) from None


def _peer_key(program: Any, target_type: str) -> bytes:
    try:
        program.compile(target_type, cache=_capture_resource())
    except _KeyCaptured as captured:
        return captured.key
    except ValueError as exc:
        raise ProgramCacheKeyError(
            f"cuda.core refused to key this Program ({exc}). A plain Program hides its "
            "source and options; build it with nexus_cache.program.CacheableProgram(...) "
            "or pass CompileInputs(code, code_type, options) to cached_compile, which "
            "accept extra_digest for these options."
        ) from exc
    raise RuntimeError(
        "cuda.core's Program.compile(cache=...) returned without consulting the cache, "
        "so no key could be derived; pass CompileInputs(code, code_type, options) instead"
    )


def delegated_key(
    program: Any,
    target_type: str,
    name_expressions: Sequence[str | bytes],
    extra_digest: object,
) -> tuple[bytes, str, str]:
    """``(key, code_type, target_type)`` for a plain ``cuda.core.Program``."""
    ct, tt = check_types(peer_code_type(program), target_type)
    strategy = strategy_for(ct)
    digest = check_extra_digest(extra_digest)
    names = strategy.encode_name_expressions(name_expressions)
    peer = _peer_key(program, tt)
    h = KeyHasher()
    h.add("schema", str(KEY_SCHEMA_VERSION).encode())
    h.add("backend", b"delegated:" + strategy.backend.encode())
    h.add("frontend", _probes.frontend_identity())
    h.add("toolchain", strategy.version_probe())
    h.add("target_type", tt.encode())
    h.add("peer_key", peer)
    if names is not None:
        h.add("names", pack(list(names)))
    h.add("extra_digest", b"" if digest is None else b"\x01" + digest)
    return h.digest(), ct, tt
