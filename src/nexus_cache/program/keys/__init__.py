"""Program cache keys: prove that two compiles produce the same binary.

One strategy per compiler backend (:class:`NvrtcStrategy` for ``c++``,
:class:`LinkerStrategy` for ``ptx``, :class:`NvvmStrategy` for ``nvvm``)
owns validation, code encoding, the canonical option fingerprint,
name-expression encoding, the toolchain probe and extra payload;
:func:`make_program_cache_key` dispatches and hashes. Imports only the
standard library; ``cuda.bindings`` is loaded by the probes on first use.
"""

from __future__ import annotations

from nexus_cache.program.keys._derive import (
    KEY_SCHEMA_VERSION,
    SUPPORTED_TARGETS,
    check_extra_digest,
    make_program_cache_key,
)
from nexus_cache.program.keys._linker import LinkerStrategy
from nexus_cache.program.keys._nvrtc import NvrtcStrategy
from nexus_cache.program.keys._nvvm import NvvmStrategy
from nexus_cache.program.keys._probes import clear_probe_cache
from nexus_cache.program.keys._strategy import KeyStrategy

__all__ = [
    "KEY_SCHEMA_VERSION",
    "SUPPORTED_TARGETS",
    "KeyStrategy",
    "LinkerStrategy",
    "NvrtcStrategy",
    "NvvmStrategy",
    "check_extra_digest",
    "clear_probe_cache",
    "make_program_cache_key",
]
