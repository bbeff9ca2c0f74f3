"""``cached_compile``: ``Program.compile`` through any program cache resource."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from nexus_cache.program._ptxcheck import warn_if_unloadable
from nexus_cache.program._resource import ProgramCacheResource, as_value_bytes
from nexus_cache.program._sidecar import decode_meta, encode_meta, sidecar_key
from nexus_cache.program.keys import _probes
from nexus_cache.program.keys._canon import option_fields
from nexus_cache.program.keys._derive import (
    check_extra_digest,
    make_program_cache_key,
    program_name,
)

__all__ = ["CompileInputs", "cached_compile"]


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


class _Plan(NamedTuple):  # a NamedTuple: built on every lookup, and cheap to build
    key: bytes
    code_type: str
    target_type: str
    name: str | None  # None: only the sidecar knows it
    needs_meta: bool
    inputs: CompileInputs | None
    program: Any


_MEMO_MAX = 256
_memo: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_PLAIN = (str, bytes, int, float, bool, type(None))
_UNUSABLE = object()


def _frozen(value: Any) -> Any:
    """An immutable copy of a list/tuple option value, or ``_UNUSABLE``."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        items = tuple(_frozen(v) for v in value)
        return _UNUSABLE if any(v is _UNUSABLE for v in items) else items
    return _UNUSABLE  # anything else may change behind our back: do not memoize


def _option_state(options: Any) -> dict[str, Any] | None:
    if isinstance(options, dict):
        return options
    state = getattr(options, "__dict__", None)
    return state if isinstance(state, dict) else None


def _inputs_key(
    inputs: CompileInputs, target_type: str, names: tuple[Any, ...], extra_digest: object
) -> tuple[bytes, str]:
    """``(key, program name)``, memoized per inputs object for the hit path.

    Deriving a key costs ~10 us, as much as a warm FileStream hit, so
    repeated lookups of the same ``CompileInputs`` reuse its key for as long
    as the options' contents (compared by value; list values through an
    immutable copy), the target, names, ``extra_digest`` and the toolchain
    probes are unchanged. Any other value type disables the memo for those
    inputs.
    """
    digest = check_extra_digest(extra_digest)
    state = _option_state(inputs.options)
    memo_key = (id(inputs), target_type, names, digest)
    if state is not None:
        found = _memo.get(memo_key)
        if (
            found is not None
            and found[0] is inputs
            and found[3] == _probes.generation()
            and found[1] == state
            and all(_frozen(state.get(n)) == v for n, v in found[2])
        ):
            return found[4], found[5]
    key = make_program_cache_key(
        code=inputs.code,
        code_type=inputs.code_type,
        options=inputs.options,
        target_type=target_type,
        name_expressions=names,
        extra_digest=digest,
    )
    name = program_name(option_fields(inputs.options))
    if state is not None and isinstance(inputs.code, (str, bytes)):
        mutable = tuple((n, _frozen(v)) for n, v in state.items() if not isinstance(v, _PLAIN))
        if all(v is not _UNUSABLE for _, v in mutable):
            if len(_memo) >= _MEMO_MAX:
                _memo.clear()
            # Holding ``inputs`` keeps its id from being reused while memoized.
            entry = (inputs, dict(state), mutable, _probes.generation(), key, name)
            _memo[memo_key] = entry
    return key, name


def _plan(
    program: Any,
    target_type: str,
    names: tuple[str | bytes, ...],
    extra_digest: object,
) -> _Plan:
    inputs = program if isinstance(program, CompileInputs) else None
    if inputs is None:
        recorded = getattr(program, "compile_inputs", None)
        if isinstance(recorded, CompileInputs):
            inputs = recorded
    if inputs is not None:
        key, name = _inputs_key(inputs, target_type, names, extra_digest)
        code_type = inputs.code_type.lower()
        return _Plan(
            key=key,
            code_type=code_type,
            target_type=target_type.lower(),
            name=name,
            needs_meta=code_type == "c++" and bool(names),
            inputs=inputs,
            program=None if program is inputs else program,
        )
    if callable(getattr(program, "compile", None)) and hasattr(program, "backend"):
        from nexus_cache.program._delegate import delegated_key

        key, code_type, tt = delegated_key(program, target_type, names, extra_digest)
        return _Plan(key, code_type, tt, None, True, None, program)
    raise TypeError(
        "cached_compile() needs a cuda.core Program, a CacheableProgram or "
        f"CompileInputs(code, code_type, options), got {type(program).__name__}"
    )


_CONSTRUCTORS = {"cubin": "from_cubin", "ptx": "from_ptx", "ltoir": "from_ltoir"}


_builders: dict[str, Any] = {}


def _object_code(data: bytes, target_type: str, name: str, mapping: dict | None) -> Any:
    build = _builders.get(target_type)
    if build is None:
        from cuda.core import ObjectCode

        build = _builders[target_type] = getattr(ObjectCode, _CONSTRUCTORS[target_type])
    return build(data, name=name, symbol_mapping=mapping)


def _lookup(cache: ProgramCacheResource, plan: _Plan, names: tuple[Any, ...]) -> Any:
    data = cache.get(plan.key)
    if data is None:
        return None
    data = bytes(data) if not isinstance(data, bytes) else data
    if not plan.needs_meta:
        assert plan.name is not None
        return _object_code(data, plan.target_type, plan.name, None)
    raw = cache.get(sidecar_key(plan.key))
    meta = None if raw is None else decode_meta(raw, data, plan.target_type)
    if meta is None:
        return None  # binary without a matching sidecar: recompile, rewrite both
    if plan.code_type == "c++" and set(meta.symbol_mapping) != set(names):
        return None
    name = plan.name if plan.name is not None else meta.name
    return _object_code(data, plan.target_type, name, meta.symbol_mapping or None)


def cached_compile(
    program: Any,
    target_type: str,
    *,
    cache: ProgramCacheResource,
    name_expressions: Sequence[str | bytes] = (),
    logs: Any = None,
    extra_digest: bytes | bytearray | memoryview | None = None,
) -> Any:
    """Compile through ``cache``: a hit returns a fresh ``ObjectCode`` with no compile.

    ``program`` is a ``cuda.core.Program``, a :class:`CacheableProgram`, or
    :class:`CompileInputs`. The key is :func:`make_program_cache_key` of the
    program's code, code_type and options (for a plain ``Program``, whose
    source is hidden, it is derived from cuda.core's own key plus our
    toolchain identity; see ``_delegate``). ``extra_digest`` must be given
    for options that read files the key cannot see, and is then mixed in.

    *Miss:* runs the real ``Program.compile(target_type, name_expressions,
    logs)`` and stores the binary (and, when needed, its metadata sidecar).
    *Hit:* returns ``ObjectCode.from_cubin/from_ptx/from_ltoir`` of the
    cached bytes with the same ``name`` and ``symbol_mapping`` a fresh
    compile produces, so ``get_kernel("fn<float>")`` works after a hit in
    another process; ``logs`` receives nothing (no compiler ran). The PTX
    loadability ``RuntimeWarning`` is emitted on a hit exactly when the
    uncached compile would emit it.

    Errors from the compiler and from ``cache`` propagate. Thread- and
    process-safe to the extent the ``cache`` backend is: concurrent misses
    on one key all compile and the last store wins (the outputs are equal).
    """
    if isinstance(name_expressions, (str, bytes, bytearray)):
        raise TypeError(
            "name_expressions must be a sequence of str or bytes, not a single "
            f"{type(name_expressions).__name__}; wrap it: name_expressions=({name_expressions!r},)"
        )
    names = tuple(name_expressions)
    plan = _plan(program, target_type, names, extra_digest)
    hit = _lookup(cache, plan, names)
    if hit is not None:
        warn_if_unloadable(plan.code_type, plan.target_type, stacklevel=2)
        return hit

    prog = plan.program if plan.program is not None else plan.inputs.new_program()  # type: ignore[union-attr]
    obj = prog.compile(plan.target_type, names, logs)
    binary = as_value_bytes(obj)
    cache[plan.key] = binary
    if plan.needs_meta:
        meta = encode_meta(binary, plan.target_type, str(obj.name), obj.symbol_mapping)
        cache[sidecar_key(plan.key)] = meta
    return obj
