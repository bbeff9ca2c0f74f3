"""The array module behind an array, and the few helpers NumPy and CuPy need apart.

Graph code is written once against ``xp`` (NumPy or CuPy) and its sparse
module; this module is the only place that tells the two apart. CuPy is
imported lazily, only when a CuPy array is actually seen.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = [
    "array_module",
    "is_cupy",
    "scatter_add",
    "scatter_max",
    "scatter_min",
    "sparse_module",
    "to_numpy",
]


def is_cupy(xp: Any) -> bool:
    """True when ``xp`` is CuPy (checked by name: CuPy is never imported here)."""
    return getattr(xp, "__name__", "") == "cupy"


def array_module(*arrays: Any) -> Any:
    """CuPy if any of ``arrays`` is a CuPy array, else NumPy."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and any(isinstance(a, cupy.ndarray) for a in arrays):
        return cupy
    return np


def sparse_module(xp: Any) -> Any:
    """``cupyx.scipy.sparse`` for CuPy, ``scipy.sparse`` for NumPy."""
    if is_cupy(xp):
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
