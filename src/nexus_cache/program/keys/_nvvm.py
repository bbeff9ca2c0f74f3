"""Key strategy for ``code_type="nvvm"``: libNVVM."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from nexus_cache.errors import ProgramCacheKeyError
from nexus_cache.program.keys import _probes
from nexus_cache.program.keys._canon import flag, pack, tristate
from nexus_cache.program.keys._nvrtc import NvrtcStrategy
from nexus_cache.program.keys._strategy import KeyStrategy

__all__ = ["NvvmStrategy"]


def _nvvm_arch(_name: str, value: Any) -> bytes | None:
    # cuda.core hands libNVVM a virtual arch: sm_90 and compute_90 compile alike.
    if value is None:
        return None
    text = str(value)
    if text.startswith("sm_"):
        text = "compute_" + text[3:]
    return text.encode()


def _opt_level(_name: str, value: Any) -> bytes | None:
    # cuda.core emits -opt=3 for exactly True and -opt=0 for exactly False;
    # any other value (0, 1, "") emits nothing, i.e. libNVVM's default level
    # 3. So device_code_optimize=0 optimizes fully while False does not:
    # they must not share a key (a truthiness test would merge them).
    if value is True:
        return b"3"
    if value is False:
        return b"0"
    return None


# Fields cuda.core drops silently for NVVM (no flag, no error).
_IGNORED = frozenset(
    {
        "device_float128",
        "frandom_seed",
        "ofast_compile",
        "pch",
        "create_pch",
        "use_pch",
        "pch_dir",
        "pch_verbose",
        "pch_messages",
        "instantiate_templates_in_pch",
        "no_cache",
        "fdevice_time_trace",
        "link_time_optimization",  # the target type (ltoir) selects -gen-lto
        "extra_sources",  # hashed whole by extra_payload
    }
)

# NVRTC-only fields that cuda.core rejects for NVVM keep NVRTC's
# canonicalizer, so e.g. lineinfo=False and lineinfo=None stay equal; the
# ones NVVM reads itself are overridden below.
_RELEVANT = {
    **{k: v for k, v in NvrtcStrategy.relevant.items() if k not in _IGNORED},
    "arch": _nvvm_arch,
    "debug": flag,
    "device_code_optimize": _opt_level,  # -opt=0 / -opt=3 / nothing
    "ftz": tristate,
    "prec_sqrt": tristate,
    "prec_div": tristate,
    "fma": tristate,
    "numba_debug": flag,
    "use_libdevice": flag,
}


def _extra_sources(value: Any) -> list[bytes]:
    if value is None:
        return []
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes, bytearray)):
        raise ProgramCacheKeyError(
            f"option extra_sources={value!r} must be a sequence of (name, source) pairs"
        )
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ProgramCacheKeyError(
                f"option extra_sources[{i}]={item!r} must be a (name, source) pair"
            )
        name, src = item
        if not isinstance(name, str) or not isinstance(src, (str, bytes, bytearray)):
            raise ProgramCacheKeyError(
                f"option extra_sources[{i}] must be (str name, str|bytes source), got "
                f"({type(name).__name__}, {type(src).__name__})"
            )
        body = src.encode("utf-8") if isinstance(src, str) else bytes(src)
        # Order is kept: NVVM links modules in the order given, and which
        # definition wins can depend on it.
        out.append(pack([name.encode("utf-8"), body]))
    return out


class NvvmStrategy(KeyStrategy):
    backend = "nvvm"
    code_type = "nvvm"
    targets = frozenset({"ptx", "ltoir"})
    relevant = _RELEVANT
    ignored = _IGNORED
    external: ClassVar[Mapping[str, str]] = {
        "use_libdevice": "libNVVM links the libdevice bitcode found in the installed toolkit",
    }

    def encode_code(self, code: object) -> bytes:
        if isinstance(code, str):
            return code.encode("utf-8", "surrogatepass")
        if isinstance(code, (bytes, bytearray, memoryview)):
            return bytes(code)
        raise TypeError(
            f"code must be str or bytes for code_type='nvvm', got {type(code).__name__}"
        )

    def extra_payload(self, fields: Mapping[str, Any]) -> list[tuple[str, bytes]]:
        modules = _extra_sources(fields.get("extra_sources"))
        return [("extra_sources", pack(modules))] if modules else []

    def version_probe(self) -> bytes:
        return _probes.nvvm_identity()
