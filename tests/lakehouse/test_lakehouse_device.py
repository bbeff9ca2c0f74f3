"""Optional KvikIO read of a hit into device memory."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest
from lakehouse_helpers import make_cache, write_old_file

from nexus_cache.errors import BackendUnavailableError
from nexus_cache.lakehouse import kvikio_available, read_to_device

DATA = os.urandom(1 << 20)


def test_without_kvikio_it_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = str(write_old_file(tmp_path / "a.bin", DATA))
    monkeypatch.setitem(sys.modules, "kvikio", None)  # import kvikio -> ImportError
    assert not kvikio_available()
    cache = make_cache(tmp_path / "c", policy="fill_before_read")
    with cache, cache.open(source) as f, pytest.raises(BackendUnavailableError, match="kvikio"):
        read_to_device(f)


def test_remote_reads_are_refused(tmp_path: Path) -> None:
    source = str(write_old_file(tmp_path / "a.bin", DATA))
    with make_cache(tmp_path / "c") as cache, cache.open(source) as f:
        assert not f.is_local
        with pytest.raises(io.UnsupportedOperation, match="local"):
            read_to_device(f)


@pytest.mark.gpu
def test_kvikio_reads_a_hit_into_device_memory(tmp_path: Path) -> None:
    pytest.importorskip("kvikio")
    cupy = pytest.importorskip("cupy")
    source = str(write_old_file(tmp_path / "a.bin", DATA))
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache, cache.open(source) as f:
        assert f.is_local
        dev = read_to_device(f)
        assert dev.nbytes == len(DATA)
        assert bytes(cupy.asnumpy(dev)) == DATA
        out = cupy.zeros(len(DATA) + 16, dtype=cupy.uint8)
        assert read_to_device(f, out) is out
        assert bytes(cupy.asnumpy(out[: len(DATA)])) == DATA
