"""Program cache keys: prove that two compiles produce the same binary.

One strategy per compiler backend (:class:`NvrtcStrategy` for ``c++``,
:class:`LinkerStrategy` for ``ptx``, :class:`NvvmStrategy` for ``nvvm``)
owns validation, code encoding, the canonical option fingerprint,
name-expression encoding, the toolchain probe and extra payload;
:func:`make_program_cache_key` dispatches and hashes. Imports only the
standard library; ``cuda.bindings`` is loaded by the probes on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nexus_cache._lazy import lazy_exports

if TYPE_CHECKING:
    from nexus_cache.program.keys._derive import KEY_SCHEMA_VERSION as KEY_SCHEMA_VERSION
    from nexus_cache.program.keys._derive import SUPPORTED_TARGETS as SUPPORTED_TARGETS
    from nexus_cache.program.keys._derive import check_extra_digest as check_extra_digest
    from nexus_cache.program.keys._derive import make_program_cache_key as make_program_cache_key
    from nexus_cache.program.keys._linker import LinkerStrategy as LinkerStrategy
    from nexus_cache.program.keys._nvrtc import NvrtcStrategy as NvrtcStrategy
    from nexus_cache.program.keys._nvvm import NvvmStrategy as NvvmStrategy
    from nexus_cache.program.keys._probes import clear_probe_cache as clear_probe_cache
    from nexus_cache.program.keys._strategy import KeyStrategy as KeyStrategy

# public name -> module that defines it (imported above for type checkers only)
_EXPORTS: dict[str, str] = {
    "KEY_SCHEMA_VERSION": "nexus_cache.program.keys._derive",
    "SUPPORTED_TARGETS": "nexus_cache.program.keys._derive",
    "check_extra_digest": "nexus_cache.program.keys._derive",
    "make_program_cache_key": "nexus_cache.program.keys._derive",
    "LinkerStrategy": "nexus_cache.program.keys._linker",
    "NvrtcStrategy": "nexus_cache.program.keys._nvrtc",
    "NvvmStrategy": "nexus_cache.program.keys._nvvm",
    "clear_probe_cache": "nexus_cache.program.keys._probes",
    "KeyStrategy": "nexus_cache.program.keys._strategy",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
