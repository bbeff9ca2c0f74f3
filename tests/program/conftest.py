"""Fixtures of the program-cache tests: a real ``redis-server`` on loopback."""

from __future__ import annotations

import os

import pytest

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
