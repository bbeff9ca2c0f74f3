"""cuda.core's Program.compile(cache=...) accepts nexus-cache resources."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from nexus_cache.program import (
    CacheStats,
    FileStreamProgramCache,
    InMemoryProgramCache,
    ProgramCacheResource,
    RedisProgramCache,
    SQLiteProgramCache,
    TieredProgramCache,
)
from nexus_cache.program._resource import as_key_bytes, as_value_bytes

core = pytest.importorskip("cuda.core")
from cuda.core.utils import ProgramCacheResource as PeerResource  # noqa: E402

SRC = 'extern "C" __global__ void k(int *a) { *a = 2; }\n'


class DictCache(ProgramCacheResource):
    """The smallest possible backend: a dict, recording every call."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.calls: list[str] = []

    def __getitem__(self, key: bytes | str) -> bytes:
        self.calls.append("get")
        return self.data[as_key_bytes(key)]

    def __setitem__(self, key: bytes | str, value: Any) -> None:
        self.calls.append("set")
        self.data[as_key_bytes(key)] = as_value_bytes(value)

    def __delitem__(self, key: bytes | str) -> None:
        del self.data[as_key_bytes(key)]

    def __len__(self) -> int:
        return len(self.data)

    def clear(self) -> None:
        self.data.clear()

    def stats(self) -> CacheStats:
        return CacheStats(entries=len(self.data))


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def compile_twice(cache: Any) -> tuple[Any, Any]:
    options = core.ProgramOptions(arch="sm_90")
    first = core.Program(SRC, "c++", options).compile("cubin", cache=cache)
    second = core.Program(SRC, "c++", options).compile("cubin", cache=cache)
    return first, second


def test_every_backend_is_a_virtual_subclass_of_the_peer_resource() -> None:
    for cls in (
        ProgramCacheResource,
        DictCache,
        InMemoryProgramCache,
        FileStreamProgramCache,
        SQLiteProgramCache,
        RedisProgramCache,
        TieredProgramCache,
    ):
        assert issubclass(cls, PeerResource), cls


def test_program_compile_misses_then_hits_with_a_custom_subclass() -> None:
    cache = DictCache()
    first, second = compile_twice(cache)
    assert cache.calls[:2] == ["get", "set"]  # miss: looked up, compiled, stored
    assert cache.calls[2:] == ["get"]  # hit: looked up only
    assert bytes(second.code) == bytes(first.code) == next(iter(cache.data.values()))


@pytest.mark.parametrize("kind", ["memory", "filestream", "sqlite", "redis", "tiered"])
def test_program_compile_misses_then_hits_with_our_backends(
    kind: str, tmp_path: Path, needs_backend: Any
) -> None:
    from ._backends import open_cache

    needs_backend(kind)
    cache = {
        "memory": lambda: InMemoryProgramCache(),
        "filestream": lambda: FileStreamProgramCache(tmp_path / "fs"),
        "sqlite": lambda: SQLiteProgramCache(tmp_path / "c.sqlite"),
    }.get(kind, lambda: open_cache(kind, str(tmp_path)))()
    with cache:
        first, second = compile_twice(cache)
        stats = cache.stats()
    assert (stats.misses, stats.stores, stats.hits) == (1, 1, 1)
    assert bytes(second.code) == bytes(first.code)


def _child_compile(path: str, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    import cuda.core

    from nexus_cache.program import FileStreamProgramCache

    with FileStreamProgramCache(path) as cache:
        obj = cuda.core.Program(SRC, "c++", cuda.core.ProgramOptions(arch="sm_90")).compile(
            "cubin", cache=cache
        )
        queue.put((bytes(obj.code), cache.stats().hits, cache.stats().misses))


def test_filestream_entry_written_through_cuda_core_hits_in_a_new_process(tmp_path: Path) -> None:
    with FileStreamProgramCache(tmp_path / "fs") as cache:
        first, _ = compile_twice(cache)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_compile, args=(str(tmp_path / "fs"), queue))
    child.start()
    data, hits, misses = queue.get(timeout=90)
    child.join(60)
    assert child.exitcode == 0
    assert (hits, misses) == (1, 0)
    assert data == bytes(first.code)


# -- registration timing, in fresh interpreters ------------------------------------------


def test_registration_waits_for_cuda_core_without_importing_it() -> None:
    out = _run(
        """
        import sys
        import nexus_cache.program as p
        from nexus_cache.program._interop import _ImportHook
        assert "cuda.core" not in sys.modules and "cuda" not in sys.modules
        assert any(isinstance(f, _ImportHook) for f in sys.meta_path)
        import cuda.core
        from cuda.core.utils import ProgramCacheResource as Peer
        import cuda.core.utils._program_cache._abc as abc_mod
        assert issubclass(p.FileStreamProgramCache, Peer)
        assert not any(isinstance(f, _ImportHook) for f in sys.meta_path)
        assert type(abc_mod.__spec__.loader).__name__ != "_RegisteringLoader"
        assert abc_mod.__loader__ is abc_mod.__spec__.loader
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_registration_is_immediate_when_cuda_core_is_already_loaded() -> None:
    out = _run(
        """
        import sys
        import cuda.core.utils
        import nexus_cache.program as p
        from nexus_cache.program._interop import _ImportHook, is_registered
        assert is_registered()
        assert issubclass(p.InMemoryProgramCache, cuda.core.utils.ProgramCacheResource)
        assert not any(isinstance(f, _ImportHook) for f in sys.meta_path)
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_without_cuda_core_nothing_happens() -> None:
    out = _run(
        """
        import sys
        sys.modules["cuda"] = None  # cuda absent: every import of it fails
        import nexus_cache.program as p
        from nexus_cache.errors import BackendUnavailableError
        try:
            p.register_with_cuda_core()
        except BackendUnavailableError as exc:
            assert "nexus-cache[cuda]" in str(exc)
        else:
            raise AssertionError("register_with_cuda_core() must fail loudly without cuda.core")
        c = p.InMemoryProgramCache()
        c[b"k"] = b"v"
        assert c.get(b"k") == b"v"
        print("ok")
        """
    )
    assert out.strip() == "ok"


# -- warming a cache ahead of time: one documented way per path ----------------

SENTINEL = b"\x7fELF pre-filled, no compiler ran"


@pytest.mark.parametrize("kind", ["memory", "filestream", "sqlite", "redis", "tiered"])
def test_prefill_for_program_compile_uses_cuda_cores_key(
    kind: str, tmp_path: Path, needs_backend: Any
) -> None:
    needs_backend(kind)
    from cuda.core.utils import make_program_cache_key as cuda_core_key

    from ._backends import open_cache

    options = core.ProgramOptions(arch="sm_90")
    with open_cache(kind, str(tmp_path)) as cache:
        cache[cuda_core_key(code=SRC, code_type="c++", options=options, target_type="cubin")] = (
            SENTINEL
        )
        obj = core.Program(SRC, "c++", options).compile("cubin", cache=cache)
        assert bytes(obj.code) == SENTINEL  # served from the pre-filled entry
        assert len(cache) == 1


@pytest.mark.parametrize("kind", ["memory", "filestream", "sqlite", "redis", "tiered"])
def test_prefill_for_cached_compile_uses_our_key(
    kind: str, tmp_path: Path, needs_backend: Any
) -> None:
    needs_backend(kind)
    from nexus_cache.program import CompileInputs, cached_compile, make_program_cache_key

    from ._backends import open_cache

    options = core.ProgramOptions(arch="sm_90")
    with open_cache(kind, str(tmp_path)) as cache:
        cache[
            make_program_cache_key(code=SRC, code_type="c++", options=options, target_type="cubin")
        ] = SENTINEL
        obj = cached_compile(CompileInputs(SRC, "c++", options), "cubin", cache=cache)
        assert bytes(obj.code) == SENTINEL
        # the same entry serves a CacheableProgram, which is a real Program
        from nexus_cache.program import CacheableProgram

        again = cached_compile(CacheableProgram(SRC, "c++", options), "cubin", cache=cache)
        assert bytes(again.code) == SENTINEL
        assert len(cache) == 1


def test_explicit_registration_returns_true_and_removes_the_hook() -> None:
    out = _run(
        """
        import sys
        import nexus_cache.program as p
        from nexus_cache.program._interop import _ImportHook
        assert p.register_with_cuda_core() is True
        from cuda.core.utils import ProgramCacheResource as Peer
        assert issubclass(p.SQLiteProgramCache, Peer)
        assert not any(isinstance(f, _ImportHook) for f in sys.meta_path)
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_what_the_hook_swallows_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    from nexus_cache.program import _interop

    class Broken:
        __name__ = "cuda.core.utils._program_cache._abc"

        @property
        def ProgramCacheResource(self):
            raise RuntimeError("unknown layout")

    with caplog.at_level("WARNING", logger="nexus_cache.program"):
        _interop._ImportHook().loaded(Broken())
    assert "could not register nexus-cache resources" in caplog.text
    assert "unknown layout" in caplog.text
