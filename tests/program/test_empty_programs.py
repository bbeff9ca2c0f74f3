"""A program of 0 bytes is never stored: the caches refuse it, cached_compile returns it
uncached with a warning (``ltoir`` without link-time optimization compiles to nothing)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from nexus_cache.errors import EmptyProgramError, NexusCacheError
from nexus_cache.program import (
    CompileInputs,
    InMemoryProgramCache,
    ProgramCacheResource,
    cached_compile,
    make_program_cache_key,
)

from ._backends import BACKENDS, open_cache

KEY = b"k" * 32
PLAIN = 'extern "C" __global__ void k(int *a) { *a = 1; }\n'


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("empty", [b"", bytearray(), memoryview(b"")])
def test_storing_zero_bytes_raises_and_stores_nothing(
    kind: str, empty: Any, tmp_path: Path
) -> None:
    with open_cache(kind, str(tmp_path)) as cache:
        cache[KEY] = b"\x7fELF old"
        with pytest.raises(EmptyProgramError, match="empty program") as info:
            cache[KEY] = empty
        assert isinstance(info.value, ValueError)
        assert isinstance(info.value, NexusCacheError)
        assert cache.get(KEY) == b"\x7fELF old"  # the previous entry stays
        with pytest.raises(EmptyProgramError):
            cache[b"n" * 32] = empty
        assert cache.get(b"n" * 32) is None
        assert len(cache) == 1
        assert cache.stats().bytes == len(b"\x7fELF old")


class _DictCache(ProgramCacheResource):
    """A user's minimal resource that accepts anything, empty values included."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def __getitem__(self, key: bytes | str) -> bytes:
        return self.data[bytes(key, "utf-8") if isinstance(key, str) else key]

    def __setitem__(self, key: bytes | str, value: Any) -> None:
        self.data[bytes(key, "utf-8") if isinstance(key, str) else key] = bytes(value)

    def __delitem__(self, key: bytes | str) -> None:
        del self.data[bytes(key, "utf-8") if isinstance(key, str) else key]

    def __len__(self) -> int:
        return len(self.data)

    def clear(self) -> None:
        self.data.clear()


def _inputs(**options: Any) -> Any:
    core = pytest.importorskip("cuda.core")
    return CompileInputs(PLAIN, "c++", core.ProgramOptions(arch="sm_90", **options))


def test_an_empty_compile_is_returned_uncached_with_a_warning() -> None:
    cache = InMemoryProgramCache()
    inputs = _inputs()  # ltoir without link_time_optimization: NVRTC makes 0 bytes
    with pytest.warns(RuntimeWarning, match="0 bytes.*link_time_optimization=True"):
        obj = cached_compile(inputs, "ltoir", cache=cache)
    assert bytes(obj.code) == b""
    assert len(cache) == 0
    assert cache.stats().stores == 0
    with pytest.warns(RuntimeWarning, match="0 bytes"):  # compiled again: nothing was cached
        cached_compile(inputs, "ltoir", cache=cache)
    assert len(cache) == 0


def test_a_real_ltoir_is_still_cached() -> None:
    cache = InMemoryProgramCache()
    inputs = _inputs(link_time_optimization=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        obj = cached_compile(inputs, "ltoir", cache=cache)
    assert len(bytes(obj.code)) > 0
    assert len(cache) == 1


def test_an_empty_entry_already_stored_reads_as_a_miss() -> None:
    cache = _DictCache()
    inputs = _inputs(link_time_optimization=True)
    key = make_program_cache_key(
        code=PLAIN, code_type="c++", options=inputs.options, target_type="ltoir"
    )
    cache[key] = b""  # written by an earlier version, or by another tool
    obj = cached_compile(inputs, "ltoir", cache=cache)
    assert len(bytes(obj.code)) > 0
    assert cache[key] == bytes(obj.code)
