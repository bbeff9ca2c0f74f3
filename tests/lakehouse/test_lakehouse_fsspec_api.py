"""The parts of fsspec's cached-filesystem API that apply to a read-only
whole-file cache: protocol stripping, parents, instance reuse, open_local,
the async cat forms."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import fsspec
import pytest

from nexus_cache.lakehouse import CacheStatus, LakehouseCache, NexusCacheFileSystem

from ._helpers import make_cache, write_old_file


@pytest.fixture
def memory() -> Any:
    m = fsspec.filesystem("memory")
    m.pipe("/h19/a/b/afile", b"hello world")
    yield m
    m.rm("/h19", recursive=True)


def test_strip_protocol_and_parent_follow_the_wrapped_filesystem(memory: Any) -> None:
    fs = fsspec.filesystem("nexus", target_protocol="memory")
    for url in ("memory://h19/afile", "nexus://h19/afile", "nexus::memory://h19/afile"):
        assert fs._strip_protocol(url) == "/h19/afile", url
    assert fs._strip_protocol(["memory://x", "nexus://y"]) == ["/x", "/y"]
    assert fs._parent("nexus::memory://h19/a/b/afile") == "/h19/a/b"
    assert fs.cat_file("nexus::memory://h19/a/b/afile") == b"hello world"
    local = NexusCacheFileSystem()
    assert local._strip_protocol("nexus::file:///tmp/x/y") == "/tmp/x/y"
    assert local._parent("nexus:///tmp/x/y") == "/tmp/x"
    # the class still strips its own prefixes (fsspec calls it without an instance)
    assert NexusCacheFileSystem._strip_protocol("nexus::s3://b/k") == "s3://b/k"


def test_the_same_arguments_give_the_same_instance(memory: Any, tmp_path: Path) -> None:
    a = fsspec.filesystem("nexus", target_protocol="memory")
    assert fsspec.filesystem("nexus", target_protocol="memory") is a
    root = str(tmp_path / "c")
    b = NexusCacheFileSystem(fs=memory, cache_storage=root)
    assert NexusCacheFileSystem(fs=memory, cache_storage=root) is b
    assert b is not a
    chained = [
        fsspec.core.url_to_fs("nexus::memory://h19/a", nexus={"cache_storage": root})[0]
        for _ in range(2)
    ]
    assert chained[0] is chained[1]


def test_a_cache_object_is_never_shared_between_instances(tmp_path: Path) -> None:
    path = write_old_file(tmp_path / "lake" / "a.bin", b"abc")
    one = make_cache(tmp_path / "one", policy="fill_before_read")
    two = make_cache(tmp_path / "two", policy="fill_before_read")  # the same configuration
    try:
        fs_one, fs_two = NexusCacheFileSystem(cache=one), NexusCacheFileSystem(cache=two)
        assert fs_one is not fs_two
        assert (fs_one.cache, fs_two.cache) == (one, two)
        assert fs_two.cat_file(str(path)) == b"abc"
        assert two.events.counts().get("read.miss") == 1
        assert not one.events.reads()
    finally:
        one.close()
        two.close()


def test_a_reused_instance_follows_the_process_wide_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nexus_cache.lakehouse import _cache as cache_module

    monkeypatch.setattr(cache_module, "_default", None)
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_ROOT", str(tmp_path / "first"))
    fs = NexusCacheFileSystem()
    first = fs.cache
    monkeypatch.setattr(cache_module, "_default", None)
    monkeypatch.setenv("NEXUS_LAKEHOUSE_CACHE_ROOT", str(tmp_path / "second"))
    assert NexusCacheFileSystem() is fs
    assert fs.cache is not first
    assert fs.cache.config.root == tmp_path / "second"
    monkeypatch.setattr(cache_module, "_default", None)


def test_open_local_returns_the_local_file_of_the_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_old_file(tmp_path / "lake" / "a.bin", b"local bytes")
    # no root: the local source is its own local file
    with make_cache(None) as cache:
        assert fsspec.open_local(f"nexus::file://{path}", nexus={"cache": cache}) == str(path)
    # fill_before_read: the entry the open filled, then the hit
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        for status in (CacheStatus.MISS, CacheStatus.HIT):
            local = fsspec.open_local(f"nexus::file://{path}", nexus={"cache": cache})
            assert cache.events.reads()[-1].cache_status is status
            assert local.startswith(str(tmp_path / "c"))
            assert Path(local).read_bytes() == b"local bytes"


def test_async_cat_forms_read_through_the_cache(tmp_path: Path) -> None:
    path = str(write_old_file(tmp_path / "lake" / "a.bin", bytes(range(100))))
    with make_cache(tmp_path / "c", policy="fill_before_read") as cache:
        fs = NexusCacheFileSystem(cache=cache)

        async def both() -> tuple[bytes, list[Any]]:
            return (
                await fs._cat_file(path, 10, 20),
                await fs._cat_ranges([path, path], [0, 90], [5, None]),
            )

        part, ranges = asyncio.run(both())
        statuses = [d.cache_status for d in cache.events.reads()]
    assert part == bytes(range(10, 20))
    assert ranges == [bytes(range(5)), bytes(range(90, 100))]
    assert statuses[0] is CacheStatus.MISS
    assert set(statuses[1:]) == {CacheStatus.HIT}


def test_open_local_of_a_removed_root_recreates_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    path = write_old_file(tmp_path / "lake" / "a.bin", b"again")
    root = tmp_path / "c"
    with make_cache(root, policy="fill_before_read") as cache:
        url = f"nexus::file://{path}"
        first = fsspec.open_local(url, nexus={"cache": cache})
        shutil.rmtree(root)
        assert not os.path.exists(first)
        assert fsspec.open_local(url, nexus={"cache": cache}) == str(path)  # read remotely
        again = fsspec.open_local(url, nexus={"cache": cache})  # filled again
        assert again == first
        assert Path(again).read_bytes() == b"again"
        assert isinstance(cache, LakehouseCache)


def test_distinct_paths_share_one_instance(memory: Any, tmp_path: Path) -> None:
    # URL chaining hands each path to the filesystem (fsspec's "fo"); were it
    # part of the instance token, every distinct path read would leave an
    # instance in fsspec's cache, without bound in a long-running server.
    NexusCacheFileSystem.clear_instance_cache()
    root = str(tmp_path / "c")
    for i in range(100):
        memory.pipe(f"/h19/many/{i}.bin", b"%d" % i)
    local = [write_old_file(tmp_path / "lake" / f"{i}.bin", b"%d" % i) for i in range(100)]
    for i in range(100):
        with fsspec.open(f"nexus::memory://h19/many/{i}.bin", nexus={"cache_storage": root}) as f:
            assert f.read() == b"%d" % i
        with fsspec.open(f"nexus::file://{local[i]}", nexus={"cache_storage": root}) as f:
            assert f.read() == b"%d" % i
    # one instance per configuration: memory:// and file:// under one root
    assert len(NexusCacheFileSystem._cache) == 2
    fs, path = fsspec.core.url_to_fs(
        "nexus::memory://h19/many/7.bin", nexus={"cache_storage": root}
    )
    assert path == "/h19/many/7.bin"
    assert fs.cat_file(path) == b"7"
    assert len(NexusCacheFileSystem._cache) == 2


def test_open_local_never_names_a_local_file_of_the_same_name(tmp_path: Path) -> None:
    # A memory:// object and a local file at the same path, with other bytes:
    # the object's path is not a local file of its bytes, whatever the policy.
    from nexus_cache.errors import NoLocalFileError

    same = tmp_path / "same.bin"
    write_old_file(same, b"the local file's bytes")
    memory = fsspec.filesystem("memory")
    memory.pipe(str(same), b"the memory object's bytes")
    url = f"nexus::memory://{same}"
    try:
        for root, policy in (
            (None, "disabled"),
            ("rt", "read_through"),
            ("fb", "fill_before_read"),
        ):
            with make_cache(root and tmp_path / root, policy=policy) as cache:
                with pytest.raises(NoLocalFileError, match=r"memory://.*no local path") as caught:
                    fsspec.open_local(url, nexus={"cache": cache})
                assert isinstance(caught.value, ValueError)  # as fsspec's own refusals
                # reading works; code that peeks at the name finds none
                with fsspec.open(url, nexus={"cache": cache}) as f:
                    assert getattr(f, "name", None) is None
                    assert f.read() == b"the memory object's bytes"
        # the local file through file:// is its own bytes
        with make_cache(None) as cache:
            local = fsspec.open_local(f"nexus::file://{same}", nexus={"cache": cache})
        assert Path(local).read_bytes() == b"the local file's bytes"
    finally:
        memory.rm(str(same))
