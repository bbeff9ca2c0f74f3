"""Full reductions (``sum``, ``any``, ``all``) and the kernels CuPy compiles for them.

CuPy hands a full sum of int64, uint64 or floating values to CUB's device
reduce, which ships compiled with CuPy. Every other full reduction (a sum of
int32 or bool values, ``any``, ``all``) it compiles at run time as a CUB
block reduction, with a block size it picks from the input's length: 32
threads up to 128 elements, then 64, 128 and 256 up to 256, 512 and 1024
elements, 512 threads beyond (an empty input takes a plain reduction kernel
of its own). Each block size is a pair of kernels (two passes), compiled the
first time a length of its class is reduced: a first query whose lengths
fall in a class the warm-up never reduced pays that compile (about a second
a kernel).

So graph code reduces through :func:`reduce`: a run inside :func:`recording`
collects the ``(op, dtype, block size)`` of every compiled reduction it
launched (on NumPy too, so the host tests see what CUDA would compile), and
the tests check that a warm-up's set covers a real query's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, Literal

import numpy as np

__all__ = ["BLOCK_SIZES", "CompiledReduction", "compiled_shape", "recording", "reduce"]

#: the block sizes CuPy's compiled full reductions take, smallest first
BLOCK_SIZES = (32, 64, 128, 256, 512)
_ITEMS_PER_THREAD = 4
# the sums CUB's precompiled device reduce takes (no promotion of the dtype)
_PRECOMPILED_SUMS = frozenset(("int64", "uint64", "float32", "float64", "complex64", "complex128"))

#: ``(op, dtype name, block size)``: one compiled reduction kernel pair (block 0: empty input)
CompiledReduction = tuple[str, str, int]

_RECORD: ContextVar[set[CompiledReduction] | None] = ContextVar("_RECORD", default=None)


def compiled_shape(op: str, dtype: Any, length: int) -> CompiledReduction | None:
    """The compiled kernel CuPy launches to reduce ``length`` values of ``dtype``
    with ``op``; None when it uses the precompiled device reduce."""
    name = np.dtype(dtype).name
    if op == "sum" and name in _PRECOMPILED_SUMS:
        return None
    if length <= 0:
        return (op, name, 0)
    wanted = 1 << max(0, (-(-length // _ITEMS_PER_THREAD) - 1).bit_length())
    return (op, name, min(max(wanted, BLOCK_SIZES[0]), BLOCK_SIZES[-1]))


def reduce(op: Literal["sum", "any", "all"], values: Any) -> Any:
    """``values.sum()``, ``.any()`` or ``.all()``, recorded inside :func:`recording`."""
    seen = _RECORD.get()
    if seen is not None:
        shape = compiled_shape(op, values.dtype, int(values.size))
        if shape is not None:
            seen.add(shape)
    return getattr(values, op)()


@contextlib.contextmanager
def recording() -> Iterator[set[CompiledReduction]]:
    """Collect the compiled reductions that graph code runs in this context (tests)."""
    seen: set[CompiledReduction] = set()
    token = _RECORD.set(seen)
    try:
        yield seen
    finally:
        _RECORD.reset(token)
