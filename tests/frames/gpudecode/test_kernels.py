"""The page decoder's CUDA kernels compile with the real NVRTC (no GPU needed)."""

from __future__ import annotations

import io
import re
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
    """With line info, as the loader compiles them; ptxas reports no spill and
    no local memory (a kernel that needs either is slow on every GPU)."""
    core = pytest.importorskip("cuda.core")
    options = core.ProgramOptions(
        arch="sm_90",
        lineinfo=True,
        ptxas_options=["--warn-on-spills", "--warn-on-local-memory-usage"],
    )
    program = core.Program(kernel_source(name, size), "c++", options=options)
    log = io.StringIO()
    module = program.compile("cubin", name_expressions=(name,), logs=log)
    assert module.code[:4] == b"\x7fELF"  # a cubin image
    assert "warning" not in log.getvalue().lower(), log.getvalue()


#: a C cast to a pointer type: reading a wider type through it from a byte
#: offset is a misaligned access on the GPU (the heap's pages start at any byte)
_POINTER_CAST = re.compile(r"\(\s*(?:const\s+)?[A-Za-z_][A-Za-z_ ]*\*\s*\)|reinterpret_cast")


@pytest.mark.parametrize(("name", "size"), _CASES)
def test_kernels_read_the_heap_bytewise(name: str, size: int | None) -> None:
    source = kernel_source(name, size)
    assert _POINTER_CAST.findall(source) == []
    # the check itself finds the cast it is for
    assert _POINTER_CAST.search("v = *(const long long*)(heap + pos);")


def test_kernels_compile_through_the_program_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("cuda.core")
    from nexus_cache._kernel_loader import compile_cubin

    monkeypatch.setenv("NEXUS_PROGRAM_CACHE_DIR", str(tmp_path / "programs"))
    source = kernel_source("hybrid_expand")
    _, compiled = compile_cubin(source, "hybrid_expand", "sm_90")
    again, compiled_again = compile_cubin(source, "hybrid_expand", "sm_90")
    assert compiled
    assert not compiled_again  # the second comes from the cache
    assert again[:4] == b"\x7fELF"
    # with line info, so compute-sanitizer names the kernel's source line
    assert b".debug_line" in again


def test_element_sizes_are_checked() -> None:
    with pytest.raises(KeyError):
        kernel_source("scatter_values", 2)
    with pytest.raises(KeyError):
        kernel_source("hybrid_runs", 4)


def test_frames_loads_its_kernels_without_the_graph_package() -> None:
    """The page decoder loads its kernels through the package-wide loader:
    no module of ``frames`` imports ``nexus_cache.graph``."""
    import ast

    import nexus_cache.frames

    root = Path(nexus_cache.frames.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            offenders += [
                f"{path.name}: {n}" for n in names if n.split(".")[:2] == ["nexus_cache", "graph"]
            ]
    assert offenders == []


def test_decode_kernels_are_not_preloaded_where_the_host_decodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nexus_cache.backends import select_backend
    from nexus_cache.errors import BackendUnavailableError
    from nexus_cache.frames import preload_decode_kernels

    monkeypatch.setenv("NEXUS_DEVICE_BACKEND", "host")
    domain = select_backend().create_domain(0)
    try:
        monkeypatch.delenv("NEXUS_DECODE_ENGINE", raising=False)
        assert preload_decode_kernels(domain) is None  # the default engine is host
        assert preload_decode_kernels(domain, "auto") is None  # host memory
        with pytest.raises(BackendUnavailableError, match="NEXUS_DECODE_ENGINE"):
            preload_decode_kernels(domain, "gpu")
        monkeypatch.setenv("NEXUS_DECODE_ENGINE", "gpu")
        with pytest.raises(BackendUnavailableError):
            preload_decode_kernels(domain)
    finally:
        domain.close()
