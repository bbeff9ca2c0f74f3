"""Reading edge columns out of an edge frame onto the chosen array module.

An edge frame is a ``pyarrow.Table`` / ``RecordBatch``, a
``nexus_cache.frames.DeviceFrame``, or any mapping of column name to column
(a ``dict`` of NumPy or CuPy arrays, of Arrow arrays, or of anything with
``__cuda_array_interface__`` or ``__array__``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nexus_cache.errors import GraphInputError
from nexus_cache.graph._reductions import reduce
from nexus_cache.graph.arrays import array_module, is_device_module

__all__ = ["edge_columns", "vertex_array"]


def _column_names(frame: Any) -> list[str]:
    names = getattr(frame, "column_names", None)
    if names is None and hasattr(frame, "keys"):
        names = list(frame.keys())
    return [str(n) for n in names or []]


def _raw_column(frame: Any, name: str) -> Any:
    try:
        if hasattr(frame, "schema") and hasattr(frame, "column"):  # Arrow table / batch
            return frame.column(name)
        return frame[name]
    except (KeyError, IndexError) as exc:
        raise GraphInputError(
            f"edge frame has no column {name!r}; its columns are {_column_names(frame)}"
        ) from exc


def _device_column_array(column: Any, name: str) -> Any:
    """The values buffer of a frames ``DeviceColumn`` (fixed width, no nulls)."""
    if column.offsets is not None or column.dictionary is not None:
        raise GraphInputError(
            f"column {name!r} has Arrow type {column.type}; use an integer or float column"
        )
    validity = column.validity
    if validity is not None and not bool(reduce("all", validity)):
        raise GraphInputError(
            f"column {name!r} has null values; drop or fill them before building a graph"
        )
    return column.data


def _as_array(column: Any, name: str) -> Any:
    """A NumPy or CuPy array for one column, refusing nulls."""
    if all(hasattr(column, a) for a in ("field", "data", "validity", "offsets")):
        return _device_column_array(column, name)
    null_count = getattr(column, "null_count", 0)
    if null_count:
        raise GraphInputError(
            f"column {name!r} has {null_count} null values; drop or fill them before "
            "building a graph"
        )
    if hasattr(column, "to_numpy") and type(column).__module__.startswith("pyarrow"):
        return column.to_numpy()
    if array_module(column) is not np:
        return column
    if hasattr(column, "__cuda_array_interface__"):
        import cupy

        return cupy.asarray(column)
    return np.asarray(column)


def _refuse_huge_ints(array: np.ndarray, name: str) -> None:
    """GraphInputError when ``array`` (NumPy's object array of Python values) holds
    integers beyond int64: ids out of range, not ids of the wrong type."""
    if array.dtype != object:
        return
    values = array.reshape(-1).tolist()
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        bad = [v for v in values if not -(2**63) <= v < 2**63][:5]
        raise GraphInputError(f"{name} {bad} are outside int64; ids must fit in int64")


def vertex_array(values: Any, xp: Any, name: str) -> Any:
    """``values`` as int64 vertex ids on ``xp`` (refuses floats and ids >= 2**63)."""
    if isinstance(values, (list, tuple, int)):
        # through NumPy on every module: Python ints beyond int64 become an
        # object array there, refused below as ids out of range
        array = np.asarray(values)
        _refuse_huge_ints(array, name)
    else:
        array = _as_array(values, name)
    array = xp.asarray(array)
    if array.ndim == 0:
        array = array.reshape(1)
    if array.size == 0:
        # ``[]`` arrives as float64: no value to refuse, so no dtype to blame
        return array.reshape(0).astype(np.int64)
    if array.dtype.kind not in "iu":
        raise GraphInputError(
            f"{name} must hold integer vertex ids, got dtype {array.dtype}; cast the column "
            "to an integer type"
        )
    if array.dtype == np.uint64 and array.size and int(array.max()) > np.iinfo(np.int64).max:
        raise GraphInputError(f"{name} holds vertex ids >= 2**63; ids must fit in int64")
    return array.astype(np.int64, copy=False)


def edge_columns(
    frame: Any, source: str, destination: str, weight: str | None, xp: Any | None
) -> tuple[Any, Any, Any | None, Any]:
    """``(src, dst, weights or None, xp)`` from ``frame``; ids are int64 on ``xp``.

    Without ``xp``, the arrays stay where they are (CuPy if any column is on
    the GPU, else NumPy).
    """
    raw = {n: _as_array(_raw_column(frame, n), n) for n in (source, destination)}
    w_raw = _as_array(_raw_column(frame, weight), weight) if weight is not None else None
    if xp is None:
        xp = array_module(*raw.values(), *([w_raw] if w_raw is not None else []))
    src = vertex_array(raw[source], xp, f"column {source!r}")
    dst = vertex_array(raw[destination], xp, f"column {destination!r}")
    if src.shape != dst.shape or src.ndim != 1:
        raise GraphInputError(
            f"columns {source!r} and {destination!r} must be 1-D and of equal length, "
            f"got shapes {src.shape} and {dst.shape}"
        )
    weights = None
    if w_raw is not None:
        weights = xp.asarray(w_raw)
        if weights.dtype.kind not in "iuf" or weights.shape != src.shape:
            raise GraphInputError(
                f"weight column {weight!r} must be numeric and as long as the edge columns, "
                f"got dtype {weights.dtype} and shape {weights.shape}"
            )
        if weights.dtype.kind == "f" and not bool(reduce("all", xp.isfinite(weights))):
            raise GraphInputError(
                f"weight column {weight!r} holds NaN or infinite values; drop or fill them"
            )
    if is_device_module(xp) and not src.flags.c_contiguous:
        src, dst = xp.ascontiguousarray(src), xp.ascontiguousarray(dst)
    return src, dst, weights, xp
