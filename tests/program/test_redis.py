"""The Redis program cache and the tiered cache on a real redis-server."""

from __future__ import annotations

import logging
import multiprocessing
import time

import pytest

from nexus_cache.errors import CacheUnavailableError, ConfigError
from nexus_cache.program import (
    FileStreamProgramCache,
    InMemoryProgramCache,
    RedisProgramCache,
    TieredProgramCache,
)

from . import _mp_workers as w
from ._backends import open_cache
from ._redis_server import free_port

CTX = multiprocessing.get_context("spawn")
SRC = 'extern "C" __global__ void twice(int *a) { *a *= 2; }\n'


def _raw(url: str):  # type: ignore[no-untyped-def]
    import redis

    return redis.Redis.from_url(url)


def _run_all(procs, timeout=90):  # type: ignore[no-untyped-def]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    assert [p.exitcode for p in procs] == [0] * len(procs)


# -- several processes share one cache -------------------------------------------------


def test_spawned_processes_share_one_cache(redis_url, tmp_path):
    base = str(tmp_path)
    _run_all([CTX.Process(target=w.write_distinct, args=("redis", base, i, 40)) for i in range(3)])
    with open_cache("redis", base) as c:
        assert len(c) == 120
        for i in range(3):
            for seq in range(40):
                assert c[f"w{i}-k{seq}"] == w.make_value(i, seq)
        s = c.stats()
        assert (s.entries, s.hits, s.corrupt) == (120, 120, 0)
        assert s.bytes == sum(len(w.make_value(i, q)) for i in range(3) for q in range(40))


def test_a_reader_never_sees_a_torn_value_while_processes_rewrite(redis_url, tmp_path):
    base = str(tmp_path)
    with open_cache("redis", base) as c:
        c[b"K"] = w.make_value(0, 0)
    stop = CTX.Event()
    out = str(tmp_path / "reader.json")
    reader = CTX.Process(target=w.read_until, args=("redis", base, b"K", stop, out))
    reader.start()
    _run_all(
        [CTX.Process(target=w.write_one_key, args=("redis", base, b"K", i, 60)) for i in (1, 2)]
    )
    stop.set()
    reader.join(60)
    assert reader.exitcode == 0
    import json

    with open(out) as f:
        result = json.load(f)
    assert (result["bad"], result["corrupt"], result["misses"]) == (0, 0, 0)
    assert result["hits"] >= 50


# -- integrity ---------------------------------------------------------------------------


def test_a_damaged_value_is_a_miss_counted_corrupt_and_removed(redis_url, tmp_path):
    with RedisProgramCache(redis_url, namespace=f"t:{tmp_path}") as c:
        c[b"k"] = b"\x7fELF original binary"
        raw = _raw(redis_url)
        (name,) = list(raw.scan_iter(match=f"t:{tmp_path}:e:*"))
        assert raw.hget(name, "b") == b"\x7fELF original binary"  # the raw bytes, no wrapper
        raw.hset(name, "b", b"\x7fELF originAl binary")
        assert c.get(b"k") is None
        assert c.stats().corrupt == 1
        assert raw.exists(name) == 0
        raw.close()


def test_a_value_copied_under_another_key_is_not_served_there(redis_url, tmp_path):
    ns = f"t:{tmp_path}"
    with RedisProgramCache(redis_url, namespace=ns) as c:
        c[b"a"] = b"binary of a"
        c[b"b"] = b"binary of b"
        raw = _raw(redis_url)
        names = {n: raw.hgetall(n) for n in raw.scan_iter(match=f"{ns}:e:*")}
        (name_a,) = [n for n, v in names.items() if v[b"b"] == b"binary of a"]
        (name_b,) = [n for n, v in names.items() if v[b"b"] == b"binary of b"]
        raw.hset(name_b, mapping=names[name_a])  # a's value and record under b's key
        assert c.get(b"b") is None
        assert c.get(b"a") == b"binary of a"
        assert c.stats().corrupt == 1
        raw.close()


def test_a_missing_record_is_a_corrupt_miss(redis_url, tmp_path):
    ns = f"t:{tmp_path}"
    with RedisProgramCache(redis_url, namespace=ns) as c:
        c[b"k"] = b"v"
        raw = _raw(redis_url)
        (name,) = list(raw.scan_iter(match=f"{ns}:e:*"))
        raw.hdel(name, "r")
        assert c.get(b"k") is None
        assert c.stats().corrupt == 1
        raw.close()


# -- bounds ------------------------------------------------------------------------------


def test_ttl_expires_entries_and_a_read_renews_it(redis_url, tmp_path):
    ns = f"t:{tmp_path}"
    with RedisProgramCache(redis_url, namespace=ns, ttl=60) as c:
        c[b"k"] = b"v"
        raw = _raw(redis_url)
        (name,) = list(raw.scan_iter(match=f"{ns}:e:*"))
        raw.pexpire(name, 5_000)
        assert c[b"k"] == b"v"
        assert raw.pttl(name) > 55_000  # the read set the full TTL again
        raw.close()
    with RedisProgramCache(redis_url, namespace=ns, ttl=0.2) as c:
        c[b"short"] = b"v"
        time.sleep(0.5)
        assert c.get(b"short") is None


@pytest.mark.parametrize("setting", ["ttl", "timeout", "retry_interval"])
def test_a_setting_beyond_what_redis_and_sockets_take_is_refused_at_open(
    redis_url, tmp_path, setting
):
    # A finite but huge ttl reached the server as a PEXPIRE it refuses (every
    # store dropped, logged as an outage); a huge timeout raised OverflowError
    # out of a store. Refused up front, naming the setting.
    ns = f"t:{tmp_path}"
    for huge in (1e16, 1e300):
        with pytest.raises(ConfigError, match=f"{setting} .*at most"):
            RedisProgramCache(redis_url, namespace=ns, **{setting: huge})
    with RedisProgramCache(redis_url, namespace=ns, **{setting: 1e9}) as c:
        c[b"k"] = b"v"
        assert c.get(b"k") == b"v"
        assert c.stats().stores == 1
        assert c.reachable


def test_a_capped_cache_evicts_least_recently_read_across_objects(redis_url, tmp_path):
    # Two objects (two processes' worth) share one LRU order: the server's clock.
    ns = f"t:{tmp_path}"
    one = RedisProgramCache(redis_url, namespace=ns, max_size_bytes=350)
    two = RedisProgramCache(redis_url, namespace=ns, max_size_bytes=350)
    for k in (b"a", b"b", b"c"):
        one[k] = k * 100
    assert two[b"a"] == b"a" * 100
    two[b"d"] = b"d" * 100
    assert one.get(b"b") is None
    assert two.stats().evictions == 1
    assert one.stats().bytes == 300
    one.close()
    two.close()


def test_clear_removes_its_namespace_only_even_with_glob_characters(redis_url, tmp_path):
    star = RedisProgramCache(redis_url, namespace=f"t:{tmp_path}:*")
    other = RedisProgramCache(redis_url, namespace=f"t:{tmp_path}:x")
    star[b"k"] = b"1"
    other[b"k"] = b"2"
    star.clear()
    assert len(star) == 0
    assert other[b"k"] == b"2"
    star.close()
    other.close()


def test_a_server_bounded_by_allkeys_lru_evicts_to_plain_misses(tmp_path):
    from ._redis_server import RedisServer, redis_binary

    if redis_binary() is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(
        tmp_path / "lru", "--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"
    )
    try:
        with RedisProgramCache(server.url) as c:
            for i in range(60):
                c[f"k{i}"] = bytes([i]) * 200_000  # 12 MB into a 4 MB server
            got = [c.get(f"k{i}") for i in range(60)]
            gone = [i for i, value in enumerate(got) if value is None]  # plain misses
            for i, value in enumerate(got):  # what the server kept is intact
                assert value is None or value == bytes([i]) * 200_000
            # Redis's LRU is sampled, not exact: not always the very oldest key,
            # but more of the older half than of the newer one
            assert sum(i < 30 for i in gone) > sum(i >= 30 for i in gone)
            assert got[-1] == bytes([59]) * 200_000
            s = c.stats()
            assert (s.stores, s.corrupt) == (60, 0)
            assert 5 <= s.entries < 20
    finally:
        server.kill()


def test_a_server_out_of_memory_drops_writes_and_never_raises(tmp_path, caplog):
    from ._redis_server import RedisServer, redis_binary

    if redis_binary() is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(
        tmp_path / "oom", "--maxmemory", "3mb", "--maxmemory-policy", "noeviction"
    )
    caplog.set_level(logging.WARNING, logger="nexus_cache.program")
    try:
        with RedisProgramCache(server.url) as c:
            for i in range(20):
                c[f"k{i}"] = b"x" * 300_000  # 6 MB into a 3 MB server
            assert c.get("k0") == b"x" * 300_000  # reads go on: the server is there
            assert 0 < c.stats().stores < 20  # the rest were refused, none raised
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 1
        assert "OutOfMemoryError" in warnings[0]
        assert "writes are dropped" in warnings[0]
    finally:
        server.kill()


# -- outages -----------------------------------------------------------------------------


def test_an_unreachable_server_misses_and_drops_saying_so_once(tmp_path, caplog):
    url = f"redis://:secret@127.0.0.1:{free_port()}/0"
    c = RedisProgramCache(url, namespace="t", timeout=0.2, retry_interval=0.01)
    caplog.set_level(logging.INFO, logger="nexus_cache.program")
    for _ in range(3):
        assert c.get(b"k") is None
        c[b"k"] = b"v"
        time.sleep(0.02)  # past the retry interval: each call really tries
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "reads are misses" in warnings[0]
    assert "writes are dropped" in warnings[1]
    assert all("secret" not in m and ":***@" in m for m in warnings)
    for admin in (len, RedisProgramCache.clear):
        with pytest.raises(CacheUnavailableError, match="cannot be reached"):
            admin(c)
    s = c.stats()  # never raises: the counters, and the size last measured
    assert (s.misses, s.stores, s.entries) == (3, 0, 0)
    assert not c.reachable
    c.close()


def test_compiles_keep_working_when_the_server_is_killed_mid_run(redis_server, tmp_path, caplog):
    core = pytest.importorskip("cuda.core")
    from nexus_cache.program import CompileInputs, cached_compile

    def compile_() -> bytes:
        inputs = CompileInputs(SRC, "c++", core.ProgramOptions(arch="sm_90"))
        return bytes(cached_compile(inputs, "cubin", cache=cache).code)

    caplog.set_level(logging.INFO, logger="nexus_cache.program")
    # a live server on a loaded host may take longer than 0.2 s to answer; a killed
    # one refuses at once, whatever the timeout
    cache = RedisProgramCache(redis_server.url, timeout=2.0, retry_interval=0.3)
    first = compile_()
    assert compile_() == first
    assert (cache.stats().hits, cache.stats().stores) == (1, 1)
    redis_server.kill()
    for _ in range(3):
        assert compile_() == first  # compiled again: the cache misses, nothing raises
    assert cache.stats().hits == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    redis_server.start()  # same port, empty (no persistence)
    time.sleep(0.35)
    assert compile_() == first  # a miss, stored again
    assert compile_() == first
    assert cache.stats().hits == 2
    assert any("answers again" in r.getMessage() for r in caplog.records)
    cache.close()


# -- tiers -------------------------------------------------------------------------------


def _tiers(url, tmp_path, name):  # type: ignore[no-untyped-def]
    return [
        InMemoryProgramCache(),
        FileStreamProgramCache(tmp_path / f"fs-{name}"),
        RedisProgramCache(url, namespace=f"t:{tmp_path}"),
    ]


def test_tiers_promote_a_lower_hit_upward(redis_url, tmp_path):
    memory, files, shared = _tiers(redis_url, tmp_path, "one")
    shared[b"k"] = b"\x7fELF from another host"
    tiered = TieredProgramCache([memory, files, shared])
    assert memory.get(b"k") is None
    assert files.get(b"k") is None
    assert tiered[b"k"] == b"\x7fELF from another host"
    assert memory.get(b"k") == files.get(b"k") == b"\x7fELF from another host"
    before = shared.stats().hits
    assert tiered[b"k"] == b"\x7fELF from another host"
    assert shared.stats().hits == before  # served by the memory tier
    s = tiered.stats()
    assert (s.hits, s.misses) == (2, 0)
    assert [t.stores for t in tiered.tier_stats()] == [1, 1, 1]
    tiered.close()


def test_a_tier_in_a_second_process_reads_what_the_first_wrote(redis_url, tmp_path):
    first = TieredProgramCache(_tiers(redis_url, tmp_path, "one"))
    first[b"k"] = b"shared binary"
    second = TieredProgramCache(_tiers(redis_url, tmp_path, "two"))  # its own memory and disk
    assert second[b"k"] == b"shared binary"
    assert second.tiers[1].get(b"k") == b"shared binary"  # promoted onto its disk
    first.close()
    second.close()


def test_tiered_delete_clear_and_len(redis_url, tmp_path):
    memory, files, shared = _tiers(redis_url, tmp_path, "one")
    tiered = TieredProgramCache([memory, files, shared])
    tiered[b"a"] = b"1"
    shared[b"only-below"] = b"2"
    assert len(tiered) == 2  # the last tier's count
    del tiered[b"a"]
    assert [t.get(b"a") for t in (memory, files, shared)] == [None, None, None]
    del tiered[b"only-below"]  # held by one tier only: still deleted, no KeyError
    with pytest.raises(KeyError):
        del tiered[b"only-below"]
    tiered[b"c"] = b"3"
    tiered.clear()
    assert (len(memory), len(files), len(shared)) == (0, 0, 0)
    tiered.close()


def test_tiered_refuses_what_is_not_a_tier_list(tmp_path):
    m = InMemoryProgramCache()
    for bad, match in (([], "at least one"), ([m, m], "twice"), ([m, b"x"], "not a program")):
        with pytest.raises(ConfigError, match=match):
            TieredProgramCache(bad)
    with pytest.raises(ConfigError, match="list of program caches"):
        TieredProgramCache(m)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"url": ""}, "url="),
        ({"url": "http://x"}, "not a Redis URL"),
        ({"namespace": ""}, "namespace"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"ttl": float("inf")}, "ttl"),
        ({"ttl": -1}, "ttl"),
        ({"retry_interval": True}, "retry_interval"),
        ({"max_size_bytes": "1.5G"}, "max_size_bytes"),
    ],
)
def test_settings_are_validated(kwargs, match):
    args = {"url": "redis://127.0.0.1:1/0", **kwargs}
    with pytest.raises(ConfigError, match=match):
        RedisProgramCache(**args)
