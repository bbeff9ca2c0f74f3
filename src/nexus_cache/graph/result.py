"""The frame every graph algorithm returns: named columns keyed by original ids."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from nexus_cache.graph.arrays import copy_array, to_numpy

__all__ = ["GraphResult"]


class GraphResult(Mapping[str, Any]):
    """Named, equal-length columns on the graph's array module, plus run facts.

    It is a read-only mapping of column name to NumPy / CuPy array, so it can
    be handed to anything that takes a frame. ``valid`` optionally gives a
    boolean mask per column; masked-out rows become nulls in :meth:`to_arrow`
    (their raw values are unspecified). ``info`` holds run facts such as
    PageRank's ``iterations`` and ``converged``.

    Parameters
    ----------
    columns : mapping of str to array
        The columns, equal in length, on one array module.
    valid : mapping of str to array of bool, optional
        A validity mask per column (rows that are False read as null).
    info : mapping of str to object, optional
        Facts about the run.

    Examples
    --------
    >>> import numpy as np
    >>> from nexus_cache.graph import GraphResult
    >>> r = GraphResult(
    ...     {"vertex": np.array([1, 2]), "distance": np.array([0, 7])},
    ...     valid={"distance": np.array([True, False])},
    ...     info={"levels": 1},
    ... )
    >>> r.num_rows, list(r)
    (2, ['vertex', 'distance'])
    >>> r.to_arrow().to_pydict()
    {'vertex': [1, 2], 'distance': [0, None]}
    """

    __slots__ = ("_columns", "_valid", "info")

    def __init__(
        self,
        columns: Mapping[str, Any],
        *,
        valid: Mapping[str, Any] | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> None:
        self._columns = dict(columns)
        self._valid = dict(valid or {})
        self.info: dict[str, Any] = dict(info or {})

    def __getitem__(self, name: str) -> Any:
        return self._columns[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __len__(self) -> int:
        return len(self._columns)

    @property
    def num_rows(self) -> int:
        first = next(iter(self._columns.values()), None)
        return 0 if first is None else int(first.shape[0])

    def valid(self, name: str) -> Any | None:
        """The validity mask of column ``name`` (None: every row is valid)."""
        return self._valid.get(name)

    def copy(self) -> GraphResult:
        """An independent copy: every column, mask and result in ``info`` copied.

        The arrays are allocated where the current allocation scope puts them
        (a cached run hands its result out of the cache's memory this way).
        Contiguous arrays are copied in one memcpy each, so on CUDA the copy
        compiles no kernel (:func:`~nexus_cache.graph.arrays.copy_array`).

        Examples
        --------
        >>> import numpy as np
        >>> from nexus_cache.graph import GraphResult
        >>> r = GraphResult({"d": np.array([0, 7])}, valid={"d": np.array([True, False])})
        >>> c = r.copy()
        >>> c.to_arrow().equals(r.to_arrow()), np.shares_memory(c["d"], r["d"])
        (True, False)
        """
        result_type = type(self)
        return result_type(
            {name: copy_array(column) for name, column in self._columns.items()},
            valid={name: copy_array(mask) for name, mask in self._valid.items()},
            info={k: v.copy() if isinstance(v, result_type) else v for k, v in self.info.items()},
        )

    def to_arrow(self) -> pa.Table:
        """A ``pyarrow.Table`` with the same columns (copied to the host)."""
        arrays = {}
        for name, column in self._columns.items():
            mask = self._valid.get(name)
            host_mask = None if mask is None else ~to_numpy(mask)
            arrays[name] = pa.array(to_numpy(column), mask=host_mask)
        return pa.table(arrays)

    def __repr__(self) -> str:
        return (
            f"GraphResult(columns={list(self._columns)}, rows={self.num_rows}, info={self.info})"
        )
