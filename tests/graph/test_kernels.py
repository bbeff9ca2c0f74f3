"""The CUDA kernels of nexus_cache.graph compile with the real NVRTC (no GPU needed)."""

from __future__ import annotations

import numpy as np
import pytest

from nexus_cache.graph._kernels import intersect_source, pull_source


@pytest.mark.parametrize("source", [pull_source, intersect_source])
@pytest.mark.parametrize("offset", [np.int32, np.int64])
@pytest.mark.parametrize("vertex", [np.int32, np.int64])
def test_kernel_compiles_to_cubin(source: object, offset: type, vertex: type) -> None:
    core = pytest.importorskip("cuda.core")
    options = core.ProgramOptions(arch="sm_90")
    program = core.Program(source(offset, vertex), "c++", options=options)
    module = program.compile("cubin")
    assert module.code  # a non-empty cubin image


def test_unsupported_index_dtype_is_refused() -> None:
    with pytest.raises(KeyError):
        pull_source(np.int16, np.int32)
