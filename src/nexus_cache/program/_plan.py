"""The key of one ``cached_compile`` call, and what a hit needs besides the bytes.

``plan_for(program, target_type, names, extra_digest)`` derives exactly one
key per call and memoizes it for what is invariant:

* ``CompileInputs`` / ``CacheableProgram``: :func:`make_program_cache_key`
  of the recorded code, code type and options (memoized there, options
  compared by value and type on every call);
* a plain ``cuda.core.Program``: its source is hidden, so the key is derived
  from cuda.core's own key of that ``Program`` (see ``_delegate``). A
  ``Program`` fixes its code when it is built and reads its options object
  when it compiles, so the derived key is kept per ``Program`` object and
  reused while that options object's fields are equal to what they were
  (compared by value and type on every call, lists through an immutable
  copy) and the toolchain probes are unchanged: a hit then runs no cuda.core key
  derivation at all, with the same proof.
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

from nexus_cache.program.keys import _probes
from nexus_cache.program.keys._derive import check_extra_digest, make_program_cache_key
from nexus_cache.program.keys._keymemo import KeyMemo, option_state

__all__ = ["CompileInputs", "Plan", "plan_for"]


@dataclass(frozen=True)
class CompileInputs:
    """What a ``cuda.core.Program`` is built from: code, code_type and options.

    ``cached_compile(CompileInputs(...), ...)`` derives the full key without
    building a ``Program``; one is built (``Program(code, code_type,
    options)``) only on a miss. ``options`` is a ``ProgramOptions`` with an
    explicit ``arch``.
    """

    code: str | bytes | bytearray
    code_type: str
    options: Any

    def new_program(self) -> Any:
        """A fresh ``cuda.core.Program`` for these inputs."""
        from cuda.core import Program

        return Program(self.code, self.code_type, self.options)


#: what ``cached_compile`` accepts as ``extra_digest`` (checked by the key derivation)
_ExtraDigest: TypeAlias = "bytes | bytearray | memoryview | None"


class Plan(NamedTuple):
    key: bytes
    code_type: str
    target_type: str
    name: str | None  # None: only the sidecar knows it
    needs_meta: bool  # the symbol mapping (or the name) lives in a sidecar
    inputs: CompileInputs | None
    program: Any  # what compiles on a miss (None: inputs.new_program())


def _name_of(options: Any) -> str:
    name = options.get("name") if isinstance(options, dict) else getattr(options, "name", None)
    return "default_program" if name is None else str(name)


def _inputs_plan(
    inputs: CompileInputs,
    program: Any,
    target_type: str,
    names: tuple[Any, ...],
    extra: _ExtraDigest,
) -> Plan:
    key = make_program_cache_key(
        code=inputs.code,
        code_type=inputs.code_type,
        options=inputs.options,
        target_type=target_type,
        name_expressions=names,
        extra_digest=extra,
    )
    ct = inputs.code_type.lower()
    return Plan(
        key,
        ct,
        target_type.lower(),
        _name_of(inputs.options),
        ct == "c++" and bool(names),
        inputs,
        None if program is inputs else program,
    )


_program_memo = KeyMemo()
_OptionsType: type | None = None


def _options_of(program: Any) -> Any:
    """The ``ProgramOptions`` object a ``Program`` holds (it reads it on compile), or None.

    ``Program`` is a C-level class without an accessor; its options object
    is among the objects it references (what the garbage collector walks).
    """
    global _OptionsType
    if _OptionsType is None:
        from cuda.core import ProgramOptions

        _OptionsType = ProgramOptions
    found = [r for r in gc.get_referents(program) if type(r) is _OptionsType]
    return found[0] if len(found) == 1 else None


def _program_plan(
    program: Any, target_type: str, names: tuple[Any, ...], extra: _ExtraDigest
) -> Plan:
    from nexus_cache.program._delegate import delegated_key

    digest = check_extra_digest(extra)
    options = _options_of(program)
    state = option_state(options) if options is not None else None
    mk: Any = None
    if state is not None:
        try:
            mk = (id(program), id(options), target_type, names, digest)
            hash(mk)
        except TypeError:
            mk = None
        else:
            found = _program_memo.get(mk, state)
            if found is not None and found[0]() is program and found[1] is options:
                return found[2]._replace(program=program)
    generation = _probes.generation()
    key, ct, tt = delegated_key(program, target_type, names, digest)
    if options is None:  # the name is known only to the sidecar
        plan = Plan(key, ct, tt, None, True, None, program)
    else:
        plan = Plan(key, ct, tt, _name_of(options), ct == "c++" and bool(names), None, program)
    if mk is not None and state is not None:
        # A weak reference: the memo never keeps a Program (and its NVRTC
        # program) alive, and a new Program that reuses a dead one's id never
        # matches. The options object is held, so its id stays its own.
        try:
            ref = weakref.ref(program)
        except TypeError:
            return plan  # not weakly referenceable: derive every time
        kept = plan._replace(program=None)  # nor through the plan
        _program_memo.put(mk, state, (ref, options, kept), generation)
    return plan


def plan_for(
    program: Any, target_type: str, names: tuple[Any, ...], extra_digest: _ExtraDigest
) -> Plan:
    """The plan (one key) for compiling ``program`` to ``target_type``."""
    if type(program) is CompileInputs or isinstance(program, CompileInputs):
        return _inputs_plan(program, program, target_type, names, extra_digest)
    recorded = getattr(program, "compile_inputs", None)
    if isinstance(recorded, CompileInputs):
        return _inputs_plan(recorded, program, target_type, names, extra_digest)
    if callable(getattr(program, "compile", None)) and hasattr(program, "backend"):
        return _program_plan(program, target_type, names, extra_digest)
    raise TypeError(
        "cached_compile() needs a cuda.core Program, a CacheableProgram or "
        f"CompileInputs(code, code_type, options), got {type(program).__name__}"
    )
