"""Key strategy for ``code_type="ptx"``: the linker (nvJitLink or the driver).

``Program`` hands PTX to a ``Linker`` and translates only a handful of
``ProgramOptions`` fields into ``LinkerOptions``; every other field is
dropped on the way, so it must not perturb the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from nexus_cache.program.keys import _probes
from nexus_cache.program.keys._canon import flag, scalar, str_seq, tristate
from nexus_cache.program.keys._nvrtc import NvrtcStrategy, ptxas_side_effects
from nexus_cache.program.keys._strategy import KeyStrategy

__all__ = ["LinkerStrategy", "uses_driver_linker"]


def _present(_name: str, value: Any) -> bytes | None:
    # The linker emits a bare ``-time`` (to its info log) for any non-None value.
    return None if value is None else b"1"


_RELEVANT = {
    "arch": scalar,
    "max_register_count": scalar,
    "time": _present,
    "link_time_optimization": flag,
    "debug": flag,
    "lineinfo": flag,
    "ftz": tristate,
    "prec_div": tristate,
    "prec_sqrt": tristate,
    "fma": tristate,
    "split_compile": scalar,
    "ptxas_options": str_seq,
    "no_cache": flag,
}


# The driver linker (cuLink, used when nvJitLink cannot load) passes none of
# these to the compiler (it only warns), so under it their value cannot change
# the binary; under nvJitLink they are real flags.
_DRIVER_IGNORED = frozenset({"ftz", "prec_div", "prec_sqrt", "fma"})


def uses_driver_linker() -> bool:
    """Whether the linker probe (the one the key hashes) found the driver linker.

    Decided from the same cached probe result as the toolchain field, so one
    key never mixes two answers; a failed probe is not the driver (nothing
    collapses, and the failure marker keeps the key apart).
    """
    return _probes.linker_identity().startswith(b"linker=driver:")


class LinkerStrategy(KeyStrategy):
    backend = "linker"
    code_type = "ptx"
    targets = frozenset({"cubin", "ptx"})
    relevant = _RELEVANT
    # Everything NVRTC or NVVM reads that the PTX path drops; numba_debug is
    # dropped with a warning by Program for PTX input.
    ignored = frozenset(
        (set(NvrtcStrategy.relevant) - set(_RELEVANT)) | {"use_libdevice", "numba_debug"}
    )
    invalid: ClassVar[Mapping[str, str]] = {
        "extra_sources": "extra_sources is read only by NVVM (code_type='nvvm')"
    }

    def side_effect_options(self, fields: Mapping[str, Any]) -> list[tuple[str, Any]]:
        # The linker's -time goes to its log, not a file; only ptxas output
        # files escape the binary here.
        if ptxas_side_effects(fields.get("ptxas_options")):
            return [("ptxas_options", fields.get("ptxas_options"))]
        return []

    def option_fingerprint(self, fields: Mapping[str, Any]) -> list[tuple[str, bytes]]:
        if uses_driver_linker():
            fields = {n: v for n, v in fields.items() if n not in _DRIVER_IGNORED}
        return super().option_fingerprint(fields)

    def encode_code(self, code: object) -> bytes:
        if isinstance(code, str):
            return code.encode("utf-8", "surrogatepass")
        raise TypeError(
            f"code must be str for code_type='ptx' (Program accepts only str), got "
            f"{type(code).__name__}"
        )

    def version_probe(self) -> bytes:
        return _probes.linker_identity()
