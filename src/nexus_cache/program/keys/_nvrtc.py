"""Key strategy for ``code_type="c++"``: NVRTC."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from nexus_cache.errors import ProgramCacheKeyError
from nexus_cache.program.keys import _probes
from nexus_cache.program.keys._canon import (
    Canonicalizer,
    flag,
    int_seq,
    macros,
    scalar,
    str_seq,
    tristate,
)
from nexus_cache.program.keys._directives import find_file_directive
from nexus_cache.program.keys._strategy import KeyStrategy, refuse_external

__all__ = ["NvrtcStrategy", "encode_names", "ptxas_side_effects"]

# Sources already scanned for file directives (the scan applies translation
# phases 1-3 and lexes the text, so a hit path re-deriving a key reuses it).
_SCANNED: dict[tuple[bytes, bool], bytes | None] = {}
_SCANNED_MAX = 256


def _file_directive(code: bytes, source_dir: bool) -> bytes | None:
    try:
        return _SCANNED[code, source_dir]
    except KeyError:
        pass
    found = find_file_directive(code, source_dir=source_dir)
    if len(_SCANNED) >= _SCANNED_MAX:
        _SCANNED.clear()
    _SCANNED[code, source_dir] = found
    return found


# ptxas flags that write a file of their own (the flag name, before any '=').
_PTXAS_FILE_FLAGS = frozenset({"-o", "--output-file", "--compiler-stats-file"})


def ptxas_side_effects(value: Any) -> list[str]:
    """The entries of ``ptxas_options`` that make ptxas write a file."""
    if value is None:
        return []
    if isinstance(value, str):
        items = [value]
    elif isinstance(value, Sequence):
        items = list(value)
    else:
        return []
    hits = []
    for item in items:
        for word in str(item).split():
            if word.split("=", 1)[0] in _PTXAS_FILE_FLAGS:
                hits.append(str(item))
                break
    return hits


def encode_names(names: Sequence[str | bytes]) -> tuple[bytes, ...]:
    """Sort and type-tag name expressions.

    ``"f"`` and ``b"f"`` stay distinct: ``Program.compile`` keys
    ``ObjectCode.symbol_mapping`` by the object the caller passed, so the
    ``get_kernel`` spelling that works depends on it. ``bytearray`` is
    refused because the uncached compile cannot use it as a mapping key.
    """
    if isinstance(names, (str, bytes, bytearray)):
        raise TypeError(
            "name_expressions must be a sequence of str or bytes, not a single "
            f"{type(names).__name__}; wrap it: name_expressions=({names!r},)"
        )
    tagged = []
    for n in names:
        if isinstance(n, str):
            tagged.append(b"s:" + n.encode("utf-8", "surrogatepass"))
        elif isinstance(n, bytes):
            tagged.append(b"b:" + n)
        else:
            raise TypeError(
                f"name_expressions elements must be str or bytes, got {type(n).__name__} "
                f"({n!r}); bytearray is unhashable and cannot key the symbol mapping"
            )
    return tuple(sorted(tagged))


class NvrtcStrategy(KeyStrategy):
    backend = "nvrtc"
    code_type = "c++"
    targets = frozenset({"ptx", "cubin", "ltoir"})
    relevant: ClassVar[Mapping[str, Canonicalizer]] = {
        "arch": scalar,
        "relocatable_device_code": tristate,
        "extensible_whole_program": flag,
        "debug": flag,
        "lineinfo": flag,
        "device_code_optimize": flag,
        "ptxas_options": str_seq,
        "max_register_count": scalar,
        "ftz": tristate,
        "prec_sqrt": tristate,
        "prec_div": tristate,
        "fma": tristate,
        "use_fast_math": flag,
        "extra_device_vectorization": flag,
        "link_time_optimization": flag,
        "gen_opt_lto": flag,
        "define_macro": macros,
        "undefine_macro": str_seq,
        "include_path": str_seq,
        "use_bundled_headers": flag,
        "pre_include": str_seq,
        "no_source_include": flag,
        "std": scalar,
        "builtin_move_forward": tristate,
        "builtin_initializer_list": tristate,
        "disable_warnings": flag,
        "restrict": flag,
        "device_as_default_execution_space": flag,
        "device_int128": flag,
        "device_float128": flag,
        "optimization_info": scalar,
        "no_display_error_number": flag,
        "diag_error": int_seq,
        "diag_suppress": int_seq,
        "diag_warn": int_seq,
        "brief_diagnostics": tristate,
        "time": scalar,
        "split_compile": scalar,
        "fdevice_syntax_only": flag,
        "minimal": flag,
        "no_cache": flag,
        "fdevice_time_trace": scalar,
        "frandom_seed": scalar,
        "ofast_compile": scalar,
        "pch": flag,
        "create_pch": scalar,
        "use_pch": scalar,
        "pch_dir": scalar,
        "pch_verbose": tristate,
        "pch_messages": tristate,
        "instantiate_templates_in_pch": tristate,
        "numba_debug": flag,
    }
    ignored = frozenset({"use_libdevice"})
    invalid: ClassVar[Mapping[str, str]] = {
        "extra_sources": "extra_sources is read only by NVVM (code_type='nvvm')"
    }
    external: ClassVar[Mapping[str, str]] = {
        "include_path": "NVRTC searches those directories for headers",
        "pre_include": "NVRTC reads those headers before the source",
        "pch": "automatic PCH reads and reuses precompiled headers from disk",
        "use_pch": "NVRTC loads that precompiled header",
        "pch_dir": "NVRTC reads precompiled headers from that directory",
    }
    # time: CSV timing table; fdevice_time_trace: JSON trace; create_pch: a PCH file.
    side_effects = ("time", "fdevice_time_trace", "create_pch")

    def side_effect_options(self, fields: Mapping[str, Any]) -> list[tuple[str, Any]]:
        found = super().side_effect_options(fields)
        if ptxas_side_effects(fields.get("ptxas_options")):
            found.append(("ptxas_options", fields.get("ptxas_options")))
        return found

    def validate_sources(self, fields: Mapping[str, Any], code: bytes) -> None:
        # no_source_include: NVRTC adds no source directory to the search path
        # (an absolute or computed name is still read, so the scan still runs).
        source_dir = not flag("no_source_include", fields.get("no_source_include"))
        name = fields.get("name")
        if source_dir and isinstance(name, str) and ("/" in name or "\\" in name):
            refuse_external(
                fields,
                ["name"],
                "NVRTC resolves quoted #include directives against the directory of "
                "the program name (set no_source_include=True to turn that off)",
            )
        found = _file_directive(code, source_dir)
        if found is not None:
            directive = found.decode("utf-8", "replace")
            raise ProgramCacheKeyError(
                f"cannot derive a program cache key: the source has {directive!r}, which "
                "reads a file the key cannot see (NVRTC opens an absolute path as it is, "
                "and resolves a quoted name against the program's directory: the "
                f"working directory for options.name={fields.get('name')!r}). Pass "
                "extra_digest=<non-empty bytes, e.g. a SHA-256 over the headers> or, "
                "for a quoted name, set no_source_include=True (quoted includes then "
                "search only include_path)."
            )

    def encode_code(self, code: object) -> bytes:
        if isinstance(code, str):
            return code.encode("utf-8", "surrogatepass")
        raise TypeError(
            f"code must be str for code_type='c++' (Program accepts only str), got "
            f"{type(code).__name__}"
        )

    def encode_name_expressions(self, names: Sequence[str | bytes]) -> tuple[bytes, ...]:
        return encode_names(names)

    def version_probe(self) -> bytes:
        return _probes.nvrtc_identity()
