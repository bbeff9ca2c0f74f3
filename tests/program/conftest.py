"""Fixtures of the program-cache tests: a real ``redis-server`` on loopback, and
file-stream caches (``any_cache``: one per record carrier the filesystem holds)."""

from __future__ import annotations

import os

import pytest

from nexus_cache.program import FileStreamProgramCache
from nexus_cache.program._integrity import probe_carrier
from nexus_cache.program.filestream import _cache

from ._backends import ON_REDIS, REDIS_URL_ENV
from ._redis_server import RedisServer, redis_binary


def _need_redis() -> None:
    if redis_binary() is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    pytest.importorskip("redis")


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One server for the session; its URL is also in the environment, for spawned children."""
    _need_redis()
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    os.environ[REDIS_URL_ENV] = server.url
    yield server.url
    os.environ.pop(REDIS_URL_ENV, None)
    server.kill()


@pytest.fixture
def redis_server(tmp_path: object):  # type: ignore[no-untyped-def]
    """A server of this test's own, which the test may kill."""
    _need_redis()
    server = RedisServer(tmp_path / "redis")  # type: ignore[operator]
    yield server
    server.kill()


@pytest.fixture
def needs_backend(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Start what the parametrized ``kind`` needs (the Redis server for the Redis kinds)."""

    def need(kind: str) -> None:
        if kind in ON_REDIS:
            request.getfixturevalue("redis_url")

    return need


# -- file-stream caches -------------------------------------------------------


@pytest.fixture
def cache(tmp_path):
    return FileStreamProgramCache(tmp_path / "c")


def _supported(tmp_path) -> tuple[str, ...]:
    """The carriers this filesystem can hold: the probe's pick and every one after it."""
    (tmp_path / "probe").mkdir(exist_ok=True)
    best = probe_carrier(str(tmp_path / "probe"))
    return ("mtime", "xattr", "sidecar")[("mtime", "xattr", "sidecar").index(best) :]


@pytest.fixture(params=["mtime", "xattr", "sidecar"])
def carrier(request, tmp_path, monkeypatch):
    """Each record carrier in turn (one the filesystem cannot hold is skipped)."""
    if request.param not in _supported(tmp_path):
        pytest.skip(f"this filesystem cannot hold {request.param} records")
    monkeypatch.setattr(_cache, "probe_carrier", lambda tmp: request.param)
    return request.param


@pytest.fixture
def any_cache(tmp_path, carrier):
    c = FileStreamProgramCache(tmp_path / "c")
    assert c.record_carrier == carrier
    return c
