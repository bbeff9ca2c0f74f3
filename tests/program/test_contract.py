"""One behavioural contract, run against every program cache backend."""

from __future__ import annotations

import threading

import pytest

from nexus_cache.errors import ConfigError
from nexus_cache.program import CacheStats, ProgramCacheResource

from ._backends import BACKENDS, PERSISTENT, open_cache


@pytest.fixture(params=BACKENDS)
def kind(request):
    return request.param


@pytest.fixture
def make(kind, tmp_path, needs_backend):
    needs_backend(kind)
    opened = []

    def _make(**caps):
        cache = open_cache(kind, str(tmp_path), **caps)
        opened.append(cache)
        return cache

    yield _make
    for cache in opened:
        cache.close()


@pytest.fixture
def cache(make):
    return make()


def test_is_a_resource(cache):
    assert isinstance(cache, ProgramCacheResource)


def test_set_get_del_len(cache):
    assert len(cache) == 0
    cache[b"k1"] = b"\x7fELF one"
    cache[b"k2"] = b"two"
    assert cache[b"k1"] == b"\x7fELF one"
    assert isinstance(cache[b"k1"], bytes)
    assert len(cache) == 2
    del cache[b"k1"]
    assert len(cache) == 1
    with pytest.raises(KeyError):
        cache[b"k1"]
    with pytest.raises(KeyError):
        del cache[b"k1"]
    assert cache.get(b"k1") is None
    assert cache.get(b"k1", b"dflt") == b"dflt"
    assert cache.get(b"k2") == b"two"


def test_replace_returns_latest(cache):
    cache[b"k"] = b"old value"
    cache[b"k"] = b"new"
    assert cache[b"k"] == b"new"
    assert len(cache) == 1
    assert cache.stats().bytes == 3


def test_empty_value_round_trips(cache):
    cache[b"k"] = b""
    assert cache[b"k"] == b""


def test_update_mapping_and_pairs(cache):
    cache.update({b"a": b"1", "b": bytearray(b"2")})
    cache.update([(b"c", b"3"), ("d", memoryview(b"4"))])
    cache.update(iter([(b"e", b"5")]))
    assert [cache[k] for k in (b"a", b"b", b"c", b"d", b"e")] == [b"1", b"2", b"3", b"4", b"5"]


def test_clear(cache):
    cache.update({b"a": b"1", b"b": b"2"})
    cache.clear()
    assert len(cache) == 0
    assert cache.get(b"a") is None
    assert cache.stats().bytes == 0
    cache[b"a"] = b"again"
    assert cache[b"a"] == b"again"


def test_context_manager(make):
    c = make()
    with c as entered:
        assert entered is c
        c[b"k"] = b"v"
    c.close()  # idempotent


@pytest.mark.parametrize("key", [b"k", "k"])
def test_in_says_why_it_is_not_supported_and_what_to_call(cache, key):
    cache[b"k"] = b"v"
    with pytest.raises(TypeError, match=r"'key in .*' is not supported.*cache\.get\(key\)"):
        key in cache  # noqa: B015 - must not silently answer
    with pytest.raises(TypeError, match=r"not iterable.*cache\.get"):
        list(cache)


def test_a_subclass_of_the_five_primitives_has_default_stats():
    from nexus_cache.program import CacheStats, ProgramCacheResource

    class Dict(ProgramCacheResource):
        def __init__(self):
            self.d = {}

        def __getitem__(self, key):
            return self.d[key]

        def __setitem__(self, key, value):
            self.d[key] = bytes(value)

        def __delitem__(self, key):
            del self.d[key]

        def __len__(self):
            return len(self.d)

        def clear(self):
            self.d.clear()

    c = Dict()
    c[b"a"] = b"1"
    assert c.stats() == CacheStats(entries=1)
    assert c.get(b"missing") is None


def test_str_and_bytes_keys_are_the_same_key(cache):
    cache["kernel-é"] = b"v"
    assert cache["kernel-é".encode()] == b"v"
    cache[b"raw"] = b"w"
    assert cache["raw"] == b"w"


@pytest.mark.parametrize("bad", [1, None, 1.5, bytearray(b"k"), ("k",)])
def test_wrong_key_types(cache, bad):
    with pytest.raises(TypeError, match="bytes or str"):
        cache[bad] = b"v"
    with pytest.raises(TypeError, match="bytes or str"):
        cache[bad]
    with pytest.raises(TypeError, match="bytes or str"):
        cache.get(bad)
    with pytest.raises(TypeError, match="bytes or str"):
        del cache[bad]


@pytest.mark.parametrize("bad", [1, None, "text", [1, 2], object()])
def test_wrong_value_types(cache, bad):
    with pytest.raises(TypeError, match="bytes, bytearray, memoryview"):
        cache[b"k"] = bad
    assert cache.get(b"k") is None


def _value_forms(tmp_path, payload):
    from cuda.core import ObjectCode

    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(payload)
    return {
        "bytes": payload,
        "bytearray": bytearray(payload),
        "memoryview": memoryview(payload),
        "memoryview-slice": memoryview(b"xx" + payload + b"yy")[2:-2],
        "objectcode-bytes": ObjectCode.from_cubin(payload),
        "objectcode-path": ObjectCode.from_cubin(str(cubin)),
    }


def test_value_forms_round_trip_to_the_same_bytes(cache, tmp_path):
    pytest.importorskip("cuda.core")
    payload = b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 8
    for form, value in _value_forms(tmp_path, payload).items():
        key = f"key-{form}"
        cache[key] = value
        got = cache[key]
        assert got == payload, form
        assert type(got) is bytes


def test_path_backed_objectcode_is_read_at_write_time(cache, tmp_path):
    from cuda.core import ObjectCode

    cubin = tmp_path / "moving.cubin"
    cubin.write_bytes(b"first build")
    cache[b"k"] = ObjectCode.from_cubin(str(cubin))
    cubin.write_bytes(b"rebuilt, different")
    assert cache[b"k"] == b"first build"
    cubin.unlink()
    assert cache[b"k"] == b"first build"


def test_stored_value_is_a_copy(cache):
    buf = bytearray(b"original")
    cache[b"k"] = buf
    buf[:] = b"mutated!"
    assert cache[b"k"] == b"original"


def test_stats_counters(cache):
    assert cache.stats() == CacheStats()
    cache[b"a"] = b"12345"
    cache[b"b"] = b"678"
    cache[b"a"]
    cache.get(b"a")
    cache.get(b"missing")
    with pytest.raises(KeyError):
        cache[b"missing"]
    s = cache.stats()
    assert (s.hits, s.misses, s.stores) == (2, 2, 2)
    assert (s.entries, s.bytes) == (2, 8)
    assert (s.evictions, s.corrupt, s.oversize) == (0, 0, 0)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1.5G", "-1"])
def test_bad_caps_are_refused(make, bad):
    with pytest.raises(ConfigError, match="max_size_bytes"):
        make(max_size_bytes=bad)


def test_bad_entry_cap_is_refused(tmp_path):
    from nexus_cache.program import InMemoryProgramCache

    for bad in (0, -5, 2.0):
        with pytest.raises(ConfigError, match="max_entries must be a positive int"):
            InMemoryProgramCache(max_entries=bad)


def test_oversize_entry_is_skipped_and_evicts_nothing(make):
    c = make(max_size_bytes=100)
    c[b"a"] = b"a" * 40
    c[b"b"] = b"b" * 40
    c[b"big"] = b"x" * 15
    c[b"big"] = b"x" * 101  # too large on its own: dropped, and the stale 15 goes
    s = c.stats()
    assert s.oversize == 1
    assert c.get(b"big") is None
    assert c[b"a"] == b"a" * 40
    assert c[b"b"] == b"b" * 40
    c[b"huge"] = b"y" * 10_000
    s = c.stats()
    assert s.oversize == 2
    assert (s.entries, s.bytes) == (2, 80)
    assert c.get(b"huge") is None


def test_lru_eviction_order(make, kind):
    if kind == "tiered":
        pytest.skip(
            "each tier keeps the LRU order of the reads it served (a hit in memory "
            "does not touch the lower tiers), so eviction order is per tier"
        )
    c = make(max_size_bytes=350)
    for k in (b"a", b"b", b"c"):
        c[k] = k * 100
    assert c[b"a"] == b"a" * 100  # a becomes the most recently used
    c[b"d"] = b"d" * 100
    assert c.get(b"b") is None  # least recently used went first
    for k in (b"a", b"c", b"d"):
        assert c.get(k) == k * 100, k
    s = c.stats()
    assert s.evictions == 1
    assert s.bytes == 300


def test_entry_count_cap(tmp_path):
    from nexus_cache.program import InMemoryProgramCache

    c = InMemoryProgramCache(max_entries=2)
    c[b"a"], c[b"b"] = b"1", b"2"
    c[b"a"]
    c[b"c"] = b"3"
    assert c.get(b"b") is None
    assert c.get(b"a") == b"1"
    assert len(c) == 2


def test_threads_hammering_one_cache(make):
    c = make(max_size_bytes=4000)
    errors = []

    def work(tid):
        try:
            for i in range(150):
                key = f"k{(tid * 7 + i) % 40}"
                value = key.encode() * 10
                if i % 3:
                    got = c.get(key)
                    assert got is None or got == value
                else:
                    c[key] = value
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    s = c.stats()
    assert s.hits + s.misses == 4 * 100
    assert s.stores == 4 * 50
    assert s.bytes <= 4000


@pytest.mark.parametrize("kind", PERSISTENT)
def test_reopen_persists(kind, tmp_path):
    with open_cache(kind, str(tmp_path)) as c:
        c[b"k"] = b"\x7fELF persisted"
        c[b"gone"] = b"x"
        del c[b"gone"]
    with open_cache(kind, str(tmp_path)) as c:
        assert c[b"k"] == b"\x7fELF persisted"
        assert c.get(b"gone") is None
        assert len(c) == 1
        assert c.stats().hits == 1  # counters are per object


@pytest.mark.parametrize("kind", PERSISTENT)
def test_lru_survives_reopen(kind, tmp_path):
    with open_cache(kind, str(tmp_path)) as c:
        for k in (b"a", b"b", b"c"):
            c[k] = k * 100
        c[b"a"]
    with open_cache(kind, str(tmp_path), max_size_bytes=350) as c:
        c[b"d"] = b"d" * 100
        assert c.get(b"b") is None
        assert c.get(b"a") == b"a" * 100


@pytest.mark.parametrize("kind", PERSISTENT)
def test_a_relative_location_is_fixed_at_open(kind, tmp_path, monkeypatch):
    # A relative path followed the working directory: after a chdir the
    # file-stream cache missed every entry and built a second, unchecked tree
    # there (SQLite would reopen the wrong file in a forked child).
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    with open_cache(kind, "rel") as c:
        assert c.path.is_absolute()
        assert c.path.parent == first / "rel"
        c[b"k"] = b"v"
        monkeypatch.chdir(second)
        assert c.get(b"k") == b"v"
        c[b"k2"] = b"v2"
        assert len(c) == 2
    assert list(second.iterdir()) == []
