"""``cached_compile``: ``Program.compile`` through any program cache resource.

A hit is one straight line: the key (``plan_for``, memoized), one ``get``,
the ``ObjectCode``. Everything else (the sidecar of ``name_expressions``,
the compile and the stores) is the miss path.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from nexus_cache.program._plan import CompileInputs, Plan, plan_for
from nexus_cache.program._ptxcheck import warn_if_unloadable
from nexus_cache.program._resource import ProgramCacheResource, as_value_bytes
from nexus_cache.program._sidecar import decode_meta, encode_meta, sidecar_key

__all__ = ["CompileInputs", "cached_compile"]

_CONSTRUCTORS = {"cubin": "from_cubin", "ptx": "from_ptx", "ltoir": "from_ltoir"}
_builders: dict[str, Any] = {}
# key -> (sidecar bytes, binary bytes, target, decoded meta) of the last check.
# Few entries: they keep their binaries alive after a backend's memo let go.
_LAST_META_MAX = 64
_last_meta: dict[bytes, tuple[bytes, bytes, str, Any]] = {}


def _object_code(data: bytes, target_type: str, name: str, mapping: dict | None) -> Any:
    build = _builders.get(target_type)
    if build is None:
        from cuda.core import ObjectCode

        build = _builders[target_type] = getattr(ObjectCode, _CONSTRUCTORS[target_type])
    return build(data, name=name, symbol_mapping=mapping)


def _with_sidecar(
    cache: ProgramCacheResource, plan: Plan, data: bytes, names: tuple[Any, ...]
) -> Any:
    """The ``ObjectCode`` of a hit whose name or symbol mapping lives in the sidecar;
    ``None`` (a miss) when the sidecar is missing, damaged or describes other bytes."""
    raw = cache.get(sidecar_key(plan.key))
    if raw is None:
        return None
    # A memoizing backend hands back the same (immutable) bytes objects while
    # the entries are unchanged: then the check below has been done already.
    last = _last_meta.get(plan.key)
    if last is not None and last[0] is raw and last[1] is data and last[2] == plan.target_type:
        meta = last[3]
    else:
        meta = decode_meta(raw, data, plan.target_type)
        if meta is None:
            return None
        if len(_last_meta) >= _LAST_META_MAX:
            _last_meta.clear()
        _last_meta[plan.key] = (raw, data, plan.target_type, meta)
    if plan.code_type == "c++" and set(meta.symbol_mapping) != set(names):
        return None
    name = plan.name if plan.name is not None else meta.name
    return _object_code(data, plan.target_type, name, meta.symbol_mapping or None)


def _compile_and_store(
    cache: ProgramCacheResource, plan: Plan, names: tuple[Any, ...], logs: Any
) -> Any:
    prog = plan.program
    if prog is None:
        assert plan.inputs is not None  # a plan without a program carries its inputs
        prog = plan.inputs.new_program()
    obj = prog.compile(plan.target_type, names, logs)
    binary = as_value_bytes(obj)
    if not binary:
        # The caches refuse 0 bytes (EmptyProgramError); the caller still gets
        # what the compiler made, as an uncached compile would give it.
        warnings.warn(
            f"the {plan.target_type} compile produced 0 bytes; returned uncached (nothing "
            "stored). For target 'ltoir' enable link-time optimization: "
            "ProgramOptions(link_time_optimization=True)",
            RuntimeWarning,
            stacklevel=3,
        )
        return obj
    cache[plan.key] = binary
    if plan.needs_meta:
        meta = encode_meta(binary, plan.target_type, str(obj.name), obj.symbol_mapping)
        cache[sidecar_key(plan.key)] = meta
    return obj


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
    toolchain identity; see ``_delegate``). One key is derived per call, and
    reused by later calls with equal inputs (see ``_plan``). ``extra_digest``
    must be given for options that read files the key cannot see, and is
    then mixed in.

    *Miss:* runs the real ``Program.compile(target_type, name_expressions,
    logs)`` and stores the binary (and, when needed, its metadata sidecar).
    A compile that yields 0 bytes (``ltoir`` without link-time optimization)
    is returned uncached with a ``RuntimeWarning``; an empty entry already
    in the cache reads as a miss.
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
    plan = plan_for(program, target_type, names, extra_digest)  # the key
    data = cache.get(plan.key)  # the get
    if data:  # the object; b"" (stored by an earlier version) is a miss
        if data.__class__ is not bytes:
            data = bytes(data)
        if plan.needs_meta or plan.name is None:  # a plan without its name needs the sidecar
            obj = _with_sidecar(cache, plan, data, names)
        else:
            obj = _object_code(data, plan.target_type, plan.name, None)
        if obj is not None:
            if plan.target_type == "ptx":
                warn_if_unloadable(plan.code_type, plan.target_type, stacklevel=2)
            return obj
    return _compile_and_store(cache, plan, names, logs)
