"""A table filter as a small instruction table, for the fused filter kernel.

:func:`filter_program` turns a canonical :class:`~nexus_cache.tables.TableFilter`
and the columns it reads (fixed-width or boolean, one value per row) into
rows of :data:`INSTRUCTION_WORDS` int64 words that ``frames.fused_filter``'s
kernel interprets per row: the column's slot, the operator, how the value
is loaded (:data:`LOADS`), how it is compared (signed, unsigned or as a
double) and the constant (its bits), or for ``in`` / ``not in`` the offset
and length of its sorted values in a constants table. A clause's last
instruction ends it (AND within a clause, OR across clauses). Constants are
data: one compiled kernel serves every filter.

The comparisons are ``filter_mask``'s on NumPy exactly: an int column
against a non-integer float (or an ``in`` list holding one) compares as
doubles; a float32 column compares with the value rounded to float32; a
null satisfies no comparison, ``in`` holds for it when the list holds a
null and ``not in`` unless it does. A predicate the kernel cannot evaluate
exactly so (a string, dictionary or float16 column, an integer constant
outside the column's storage type, a float constant beyond float32's range
on a float32 column) makes the program None: the caller keeps the generic
mask. Pure functions; thread-safe.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from nexus_cache._lru import BoundedLRU
from nexus_cache.frames.column import ColumnKind, DeviceColumn
from nexus_cache.tables.filters import Predicate, TableFilter

__all__ = [
    "COMPARES",
    "INSTRUCTION_WORDS",
    "LOADS",
    "OPS",
    "FilterProgram",
    "filter_program",
]

#: operator codes (``TRUE``: an empty clause, which every row satisfies)
OPS = ("=", "!=", "<", "<=", ">", ">=", "in", "not in", "TRUE")
#: how a row's value is loaded: its storage dtype (``bool``: one byte, 0 or 1)
LOADS = tuple(
    np.dtype(t)
    for t in (
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float32",
        "float64",
        "bool",
    )
)
#: how a loaded value is compared with the constant(s)
COMPARES = ("signed", "unsigned", "double")
#: int64 words per instruction: slot, op, load, compare, constant (bits) or the
#: offset of an ``in`` list in the constants, the list's length, flags, padding
INSTRUCTION_WORDS = 8
#: flags: the instruction ends its clause; an ``in`` list holds a null
END_CLAUSE = 1
HOLDS_NULL = 2

_OP = {op: i for i, op in enumerate(OPS)}
_LOAD = {dtype: i for i, dtype in enumerate(LOADS)}
_SIGNED, _UNSIGNED, _DOUBLE = range(3)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True, eq=False)
class FilterProgram:
    """One filter's instructions over the columns ``slots`` names (in slot order):
    ``instructions`` (n x :data:`INSTRUCTION_WORDS`, int64; an ``in`` list's offset
    is into ``constants``) and ``constants`` (int64 words: each list's values, as
    int64, uint64 or float64 bits by its compare code); ``lists``: which
    instructions hold such an offset."""

    slots: tuple[str, ...]
    instructions: np.ndarray
    constants: np.ndarray
    lists: np.ndarray


#: programs by the filter's key and the dtypes of the columns it reads (False: the
#: kernel cannot run that filter on those columns)
_PROGRAMS: BoundedLRU[tuple[Any, ...], FilterProgram | bool] = BoundedLRU(256)


def filter_program(flt: TableFilter, columns: Mapping[str, DeviceColumn]) -> FilterProgram | None:
    """``flt`` as instructions over ``columns`` (every column it reads), or None when
    one of its predicates cannot run in the fused kernel (see the module doc)."""
    kinds = []
    for name in flt.columns:
        column = columns.get(name)
        if column is None or column.kind not in (ColumnKind.FIXED, ColumnKind.BOOL):
            return None
        kinds.append(column.data.dtype)
    key = (flt.key, tuple(kinds))
    known = _PROGRAMS.get(key)
    if known is not None:
        return known if isinstance(known, FilterProgram) else None
    made = _program(flt, dict(zip(flt.columns, kinds, strict=True)))
    _PROGRAMS.put(key, False if made is None else made)
    return made


def _program(flt: TableFilter, dtypes: Mapping[str, np.dtype[Any]]) -> FilterProgram | None:
    slots = {name: i for i, name in enumerate(flt.columns)}
    rows: list[list[int]] = []
    constants: list[np.ndarray] = []
    used = 0
    for clause in flt.clauses:
        if not clause:
            rows.append([0, _OP["TRUE"], 0, 0, 0, 0, END_CLAUSE, 0])
            continue
        for i, p in enumerate(clause):
            made = _instruction(p, dtypes[p.column])
            if made is None:
                return None
            words, values = made
            if values is not None:
                words[4], words[5] = used, len(values)
                constants.append(values)
                used += len(values)
            words[0] = slots[p.column]
            if i == len(clause) - 1:
                words[6] |= END_CLAUSE
            rows.append(words)
    instructions = np.array(rows, dtype=np.int64).reshape(len(rows), INSTRUCTION_WORDS)
    table = np.concatenate(constants) if constants else np.zeros(0, np.int64)
    lists = (instructions[:, 1] == _OP["in"]) | (instructions[:, 1] == _OP["not in"])
    return FilterProgram(tuple(flt.columns), instructions, table, lists)


def _instruction(p: Predicate, dtype: np.dtype[Any]) -> tuple[list[int], np.ndarray | None] | None:
    """The words of ``p`` on a column of ``dtype`` (slot and clause end left to the
    caller), with its ``in`` list's constants; None where the kernel cannot run it."""
    load = _LOAD.get(dtype)
    if load is None:  # float16, or any other storage
        return None
    op = _OP[p.op]
    if p.op in ("in", "not in"):
        holds_null = bool(p.value) and p.value[-1] is None
        values = [v for v in p.value if v is not None]
        compare = _compare_code(dtype, values)
        table = _constants(values, dtype, compare, listed=True)
        if table is None:
            return None
        return [0, op, load, compare, 0, 0, HOLDS_NULL if holds_null else 0, 0], table
    compare = _compare_code(dtype, [p.value])
    bits = _constants([p.value], dtype, compare)
    if bits is None:
        return None
    return [0, op, load, compare, int(bits[0]), 0, 0, 0], None


def _compare_code(dtype: np.dtype[Any], values: list[Any]) -> int:
    if dtype.kind == "f":
        return _DOUBLE
    if dtype.kind in "iu" and any(isinstance(v, float) for v in values):
        return _DOUBLE  # NumPy compares an int array with a float as float64
    return _UNSIGNED if dtype == np.uint64 else _SIGNED


def _constants(
    values: list[Any], dtype: np.dtype[Any], compare: int, listed: bool = False
) -> np.ndarray | None:
    """``values`` as sorted int64 words of their compare type (None: one does not fit
    the way the mask compares it). An ``in`` list (``listed``) of a float32 column is
    rounded to float32, as pyarrow's ``is_in`` casts it; a comparison's value is not
    (pyarrow and the mask compare in float64)."""
    if compare == _DOUBLE:
        if dtype == np.float32 and listed:
            if any(abs(float(v)) > _FLOAT32_MAX for v in values):
                return None
            doubles = np.array(values, dtype=np.float32).astype(np.float64)
        else:
            doubles = np.array(values, dtype=np.float64)
        if not all(math.isfinite(v) for v in doubles.tolist()):
            return None
        return np.sort(doubles).view(np.int64)
    if dtype == np.bool_:
        return np.array(sorted({int(v) for v in values}), dtype=np.int64)
    info = np.iinfo(dtype)
    if not all(info.min <= int(v) <= info.max for v in values):
        return None
    if compare == _UNSIGNED:
        return np.sort(np.array(values, dtype=np.uint64)).view(np.int64)
    return np.sort(np.array(values, dtype=np.int64))
