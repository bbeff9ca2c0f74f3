"""How the graph layer tells NumPy from a device array module: by duck typing,
never by naming or importing CuPy (``graph/arrays.py``)."""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest
import scipy.sparse

from nexus_cache.graph.arrays import array_module, is_device_module, sparse_module


def _device_package(monkeypatch: pytest.MonkeyPatch, name: str, *, with_ndarray: bool) -> Any:
    """A top-level package whose array type exposes ``__cuda_array_interface__``."""
    module = types.ModuleType(name)

    class DeviceArray:
        __module__ = f"{name}._core"

        @property
        def __cuda_array_interface__(self) -> dict[str, Any]:
            raise AssertionError("the interface is read from the type, never evaluated")

    if with_ndarray:
        module.__dict__["ndarray"] = DeviceArray
    monkeypatch.setitem(sys.modules, name, module)
    return module, DeviceArray()


def test_a_device_array_gives_the_package_whose_ndarray_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module, array = _device_package(monkeypatch, "fakegpu", with_ndarray=True)
    assert array_module(np.zeros(2), array) is module
    assert is_device_module(module)


def test_host_arrays_and_foreign_device_arrays_give_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    # a device array of a package without an ndarray (like Numba's) is input to convert
    _, foreign = _device_package(monkeypatch, "fakenumba", with_ndarray=False)
    assert array_module(np.zeros(2), foreign, [1, 2]) is np
    assert array_module() is np
    assert not is_device_module(np)
    assert sparse_module(np) is scipy.sparse


def test_copy_array_copies_every_layout_into_new_memory() -> None:
    from nexus_cache.graph.arrays import copy_array

    base = np.arange(12, dtype=np.int64).reshape(3, 4)
    for array in (base, base[:, 1], base.T, np.array([True, False, True])):
        copy = copy_array(array)
        assert copy.dtype == array.dtype
        np.testing.assert_array_equal(copy, array)
        assert not np.shares_memory(copy, array)


def test_a_result_copy_holds_no_array_of_the_original() -> None:
    from nexus_cache.graph import GraphResult

    tree = GraphResult({"source": np.array([1]), "destination": np.array([2])})
    result = GraphResult(
        {"vertex": np.array([1, 2]), "distance": np.array([0, 1], dtype=np.int32)},
        valid={"distance": np.array([True, True])},
        info={"levels": 1, "tree_edges": tree},
    )
    copy = result.copy()
    assert copy.to_arrow().equals(result.to_arrow())
    assert copy.info["levels"] == 1
    assert copy.info["tree_edges"].to_arrow().equals(tree.to_arrow())
    mask = copy.valid("distance")
    originals = [result["vertex"], result["distance"], result.valid("distance"), *tree.values()]
    copies = [copy["vertex"], copy["distance"], mask, *copy.info["tree_edges"].values()]
    assert not any(np.shares_memory(a, b) for a in copies for b in originals)
