"""The array module behind an array, and the few helpers NumPy and CuPy need apart.

Graph code is written once against ``xp`` (NumPy or CuPy) and its sparse
module; this module is the only place that tells the two apart, and it does
so without naming either device library: NumPy is the host's module and any
other module is a device one (:func:`is_device_module`); an array is on the
device when its type exposes ``__cuda_array_interface__``, and its module is
the package whose ``ndarray`` it is (:func:`array_module`). Nothing here
imports CuPy; ``cupyx`` is imported only when a device module's sparse
module is asked for.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = [
    "array_module",
    "copy_array",
    "is_device_module",
    "occurrences",
    "scatter_add",
    "scatter_max",
    "scatter_min",
    "sparse_module",
    "to_numpy",
]


def is_device_module(xp: Any) -> bool:
    """True when ``xp`` allocates device memory (CuPy): any module but NumPy.

    Graph code supports those two; NumPy's paths are the host's (SciPy, the
    host engine's loops), every other module takes the CUDA paths.
    """
    return xp is not np


def array_module(*arrays: Any) -> Any:
    """The module of the first device array among ``arrays``, else NumPy.

    Duck-typed: an array is a device array when its type exposes
    ``__cuda_array_interface__``, and its module is the top-level package
    whose ``ndarray`` it is (CuPy's). A device array of a package without an
    ``ndarray`` (Numba's) counts as input to convert, so NumPy is returned.
    """
    for array in arrays:
        kind = type(array)
        if not hasattr(kind, "__cuda_array_interface__"):
            continue
        module = sys.modules.get(kind.__module__.partition(".")[0])
        ndarray = getattr(module, "ndarray", None)
        if isinstance(ndarray, type) and isinstance(array, ndarray):
            return module
    return np


def sparse_module(xp: Any) -> Any:
    """``cupyx.scipy.sparse`` for CuPy, ``scipy.sparse`` for NumPy."""
    if is_device_module(xp):
        import cupyx.scipy.sparse as sparse

        return sparse
    import scipy.sparse as sparse

    return sparse


def to_numpy(array: Any) -> np.ndarray:
    """A host copy (or view) of a NumPy or CuPy array."""
    if isinstance(array, np.ndarray):
        return array
    get = getattr(array, "get", None)
    if get is not None:
        return get()
    return np.asarray(array)


def copy_array(array: Any) -> Any:
    """An independent copy of a NumPy or CuPy array, allocated by the current scope.

    A C-contiguous array is copied in one memcpy (``copyto`` into an empty
    array). CuPy's ``ndarray.copy()`` would launch its element-copy kernel,
    which CuPy compiles per dtype and layout the first time it meets them:
    a query whose copy no earlier work launched would pay that compile (a
    second on a fresh machine). Other layouts copy with ``copy()``.
    """
    if not array.flags.c_contiguous:
        return array.copy()
    xp = array_module(array)
    out = xp.empty(array.shape, dtype=array.dtype)
    xp.copyto(out, array)
    return out


def occurrences(xp: Any, values: Any, n: int) -> Any:
    """How often each of ``0..n-1`` occurs in ``values``, as int64.

    On a device module this is a float64 weighted bincount (one atomic add a
    value; exact below 2**53 occurrences): CuPy's unweighted bincount goes
    through CUB's histogram, whose scratch grows with the number of bins
    (1.3 GB for a million vertices on an H200), allocated in the caller's
    domain. The extra is one float64 per value.
    """
    if int(values.size) == 0:  # no bincount of nothing: CuPy wants a maximum
        return xp.zeros(n, dtype=np.int64)
    if is_device_module(xp):
        ones = xp.ones(int(values.size), dtype=np.float64)
        return xp.bincount(values, weights=ones, minlength=n).astype(np.int64)
    return xp.bincount(values, minlength=n).astype(np.int64, copy=False)


def scatter_add(xp: Any, out: Any, index: Any, values: Any) -> None:
    """``out[index] += values`` with repeated indices all counted."""
    # ufunc.at on both modules (CuPy >= 13); cupyx.scatter_* are deprecated in CuPy 14.
    xp.add.at(out, index, values)


def scatter_min(xp: Any, out: Any, index: Any, values: Any) -> None:
    """``out[index] = min(out[index], values)`` with repeated indices all applied."""
    xp.minimum.at(out, index, values)


def scatter_max(xp: Any, out: Any, index: Any, values: Any) -> None:
    """``out[index] = max(out[index], values)`` with repeated indices all applied."""
    xp.maximum.at(out, index, values)
