"""``CacheableProgram``: a real ``cuda.core.Program`` that remembers its inputs.

``cuda.core.Program`` keeps its source and options where Python cannot read
them, so :func:`cached_compile` can key a plain ``Program`` only through
cuda.core's own key (see ``_delegate``). A ``CacheableProgram`` *is* a
``Program`` (``isinstance`` holds, ``compile`` is unchanged) that also
records ``compile_inputs``, which gives ``cached_compile`` the full key
rules: ``extra_digest`` for include paths, the quoted-``#include`` scan,
canonical options.

Importing this module imports ``cuda.core``.
"""

from __future__ import annotations

from typing import Any

from cuda.core import Program, ProgramOptions

from nexus_cache.program._plan import CompileInputs

__all__ = ["CacheableProgram"]


class CacheableProgram(Program):
    """``Program(code, code_type, options)`` plus ``self.compile_inputs``."""

    def __init__(self, code: Any, code_type: str, options: Any = None) -> None:
        # Build the default options here (as Program would) so the recorded
        # inputs are the ones the compile really uses.
        if options is None:
            options = ProgramOptions()
        super().__init__(code, code_type, options)
        self.compile_inputs = CompileInputs(code, code_type, options)
