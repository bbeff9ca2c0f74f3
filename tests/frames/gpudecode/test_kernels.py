"""The page decoder's CUDA kernels compile with the real NVRTC (no GPU needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nexus_cache.frames.gpudecode.kernels import (
    ELEMENT_TYPES,
    KERNEL_NAMES,
    TYPED_KERNELS,
    kernel_source,
)

_CASES = [
    (name, size)
    for name in KERNEL_NAMES
    for size in (sorted(ELEMENT_TYPES) if name in TYPED_KERNELS else [None])
]


@pytest.mark.parametrize(("name", "size"), _CASES)
def test_kernel_compiles_to_cubin_for_sm90(name: str, size: int | None) -> None:
    core = pytest.importorskip("cuda.core")
    options = core.ProgramOptions(arch="sm_90")
    program = core.Program(kernel_source(name, size), "c++", options=options)
    module = program.compile("cubin", name_expressions=(name,))
    assert module.code[:4] == b"\x7fELF"  # a cubin image


def test_kernels_compile_through_the_program_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("cuda.core")
    from nexus_cache.graph._programs import compile_cubin

    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(tmp_path / "programs"))
    source = kernel_source("hybrid_expand")
    _, compiled = compile_cubin(source, "hybrid_expand", "sm_90")
    again, compiled_again = compile_cubin(source, "hybrid_expand", "sm_90")
    assert compiled
    assert not compiled_again  # the second comes from the cache
    assert again[:4] == b"\x7fELF"


def test_element_sizes_are_checked() -> None:
    with pytest.raises(KeyError):
        kernel_source("scatter_values", 2)
    with pytest.raises(KeyError):
        kernel_source("hybrid_runs", 4)
