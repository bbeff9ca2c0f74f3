"""The graph layer's device-module branches that use only the array API, run on
the host: NumPy behind a module that is not NumPy takes the CUDA paths
(``is_device_module``), so their logic is checked in CI without a GPU."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest

from nexus_cache.graph._build import _segment_reduce
from nexus_cache.graph.arrays import is_device_module, occurrences


def _numpy_as_a_device_module() -> Any:
    module = types.ModuleType("numpy_as_a_device")
    module.__getattr__ = lambda name: getattr(np, name)  # type: ignore[method-assign]
    return module


@pytest.fixture
def device() -> Any:
    xp = _numpy_as_a_device_module()
    assert is_device_module(xp)
    return xp


@pytest.mark.parametrize("rule", ["sum", "min", "max"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_device_segment_reduce_equals_the_host_s(device: Any, rule: str, dtype: Any) -> None:
    rng = np.random.default_rng(5)
    values = rng.normal(size=1000).astype(dtype)
    is_start = rng.random(1000) < 0.2
    is_start[0] = True
    got = _segment_reduce(device, values, is_start, rule)
    want = _segment_reduce(np, values, is_start, rule)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("size", [0, 1, 500])
def test_device_occurrences_equal_the_host_s(device: Any, size: int) -> None:
    values = np.random.default_rng(6).integers(0, 40, size)
    got = occurrences(device, values, 50)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, occurrences(np, values, 50))
