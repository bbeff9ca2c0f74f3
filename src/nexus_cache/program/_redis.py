"""A program cache on a Redis server, shared by every process and host that reaches it."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from nexus_cache.errors import BackendUnavailableError, CacheUnavailableError, ConfigError
from nexus_cache.program import _redis_scripts
from nexus_cache.program._caps import validate_cap
from nexus_cache.program._counters import OpCounters
from nexus_cache.program._integrity import entry_digest, make_record, record_matches
from nexus_cache.program._resource import (
    CacheStats,
    ProgramCacheResource,
    ProgramCacheValue,
    as_key_bytes,
    value_to_store,
)

__all__ = ["DEFAULT_NAMESPACE", "RedisProgramCache"]

_log = logging.getLogger("nexus_cache.program")

DEFAULT_NAMESPACE = "nexus-cache:program"
_SCAN_BATCH = 512


# Seconds a setting may name at most (about 31 years): beyond it Redis refuses
# the TTL (milliseconds past its 64-bit clock) and sockets the timeout.
_MAX_SECONDS = 10**9


def _seconds(name: str, value: object, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    if value <= 0:
        raise ConfigError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    if value > _MAX_SECONDS:
        never = "; for no expiry pass ttl=None" if allow_none else ""
        raise ConfigError(
            f"{name} must be at most {_MAX_SECONDS} seconds (about 31 years), got {value!r}{never}"
        )
    return float(value)


def _redacted(url: str) -> str:
    """``url`` without its password, for log lines and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RedisProgramCache(ProgramCacheResource):
    """Compiled binaries in Redis under ``namespace`` (redis-py, the ``redis`` extra).

    Each entry is a Redis hash holding the raw binary and the same
    integrity record a FileStream entry carries (XXH3 of the bytes bound to
    the key): a truncated, altered or misplaced value (copied under another
    key) reads as a miss, is removed and is counted in ``stats().corrupt``.
    Values are bytes in and bytes out; nothing is ever unpickled.

    Guarantees:

    * Thread-, process- and host-safe: every operation is one Lua script,
      which Redis runs atomically, so a reader sees the old or the new
      entry, never a torn one.
    * Never fails a compile: when the server cannot be reached (refused,
      ``timeout`` seconds without an answer, out of memory) a read is a miss
      and a write is dropped, each said once per outage in the
      ``nexus_cache.program`` log (a WARNING, and an INFO when the server
      answers again). For ``retry_interval`` seconds after a connection
      failure the cache does not try the server at all, so an outage costs
      a compile no waiting; a refusal (out of memory) drops that write
      only. ``len``, ``del`` and ``clear`` raise
      :class:`CacheUnavailableError` instead (administration); ``stats``
      then reports the size it last measured.
    * Bounds: ``ttl`` (seconds) expires an entry that long after its last
      write or read; ``max_size_bytes`` keeps an LRU index (a read moves
      the entry up, by a clock the server keeps) and a store evicts the
      least recently used entries until the namespace is under the cap.
      Without either, bound the server itself with ``maxmemory`` and
      ``maxmemory-policy allkeys-lru``. Use one cap per namespace: an
      uncapped object does not index its writes, so a capped one never
      evicts them. An entry larger than ``max_size_bytes`` on its own is
      not stored (``stats().oversize``).
    * ``len``, ``clear`` and ``stats`` walk the namespace's keys with
      ``SCAN`` (linear in the server's key count); ``clear`` removes this
      namespace only. Standalone Redis (or one shard): the eviction script
      touches keys it finds in the index.
    """

    def __init__(
        self,
        url: str,
        *,
        max_size_bytes: int | str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        ttl: float | None = None,
        timeout: float = 0.5,
        retry_interval: float = 5.0,
    ) -> None:
        if not isinstance(url, str) or not url.strip():
            raise ConfigError(
                f"url={url!r} is not accepted; give a Redis URL such as "
                "redis://host:6379/0 (NEXUS_PROGRAM_CACHE_REDIS_URL)"
            )
        if not isinstance(namespace, str) or not namespace.strip():
            raise ConfigError(f"namespace={namespace!r} is not accepted; give a non-empty string")
        self._max = validate_cap("max_size_bytes", max_size_bytes)
        ttl_s = _seconds("ttl", ttl, allow_none=True)
        self._ttl_ms = b"0" if ttl_s is None else str(max(1, round(ttl_s * 1000))).encode()
        self._timeout = _seconds("timeout", timeout)
        self._retry_interval = _seconds("retry_interval", retry_interval)
        try:
            import redis
        except ImportError as exc:
            raise BackendUnavailableError(
                "RedisProgramCache needs redis-py: pip install 'nexus-cache[redis]'"
            ) from exc
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        # Failures that mean the server is not there (as opposed to a refusal
        # such as out-of-memory, after which reads still work): these start
        # the retry interval.
        self._gone: tuple[type[BaseException], ...] = (
            redis.ConnectionError,
            redis.TimeoutError,
            OSError,
        )
        self.url = url
        self.namespace = namespace
        self._where = _redacted(url)
        try:
            # No retries inside redis-py: one failure is one miss, and the
            # retry interval below keeps an outage from costing each compile
            # a timeout.
            self._client = redis.Redis.from_url(
                url,
                socket_timeout=self._timeout,
                socket_connect_timeout=self._timeout,
                retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
                decode_responses=False,
            )
        except ValueError as exc:
            raise ConfigError(
                f"url={self._where!r} is not a Redis URL ({exc}); use redis://host:port/db, "
                "rediss:// or unix://"
            ) from None
        ns = namespace.encode()
        self._prefix = ns + b":e:"
        self._lru, self._tick = ns + b":lru", ns + b":tick"
        self._sizes, self._bytes = ns + b":sizes", ns + b":bytes"
        self._read = self._client.register_script(_redis_scripts.READ)
        self._write = self._client.register_script(_redis_scripts.WRITE)
        self._delete = self._client.register_script(_redis_scripts.DELETE)
        self._counts = OpCounters()
        self._lock = threading.Lock()
        self._retry_at = 0.0
        self._warned: set[str] = set()
        self._last_size = (0, 0)

    @property
    def max_size_bytes(self) -> int | None:
        return self._max

    # -- reaching the server ----------------------------------------------------------

    def _available(self) -> bool:
        return self._retry_at == 0.0 or time.monotonic() >= self._retry_at

    def _failed(self, what: str, exc: BaseException) -> None:
        if isinstance(exc, self._gone):
            with self._lock:
                self._retry_at = time.monotonic() + (self._retry_interval or 0.0)
        self._skipped(what, f"{type(exc).__name__}: {exc}")

    def _skipped(self, what: str, cause: str = "it failed moments ago") -> None:
        """A read missed or a write dropped for the outage: said once per outage and kind."""
        with self._lock:
            first = what not in self._warned
            self._warned.add(what)
        if first:
            consequence = {"read": "reads are misses", "write": "writes are dropped"}[what]
            _log.warning(
                "Redis program cache at %s is unavailable (%s); %s until it answers "
                "(compiles go on; the server is tried again every %.1f s)",
                self._where,
                cause,
                consequence,
                self._retry_interval,
            )

    def _answered(self) -> None:
        if self._warned or self._retry_at:
            with self._lock:
                was_down = bool(self._warned)
                self._warned.clear()
                self._retry_at = 0.0
            if was_down:
                _log.info("Redis program cache at %s answers again", self._where)

    def _unavailable(self, what: str, exc: BaseException | None) -> CacheUnavailableError:
        cause = f" ({type(exc).__name__}: {exc})" if exc is not None else " (recently unreachable)"
        return CacheUnavailableError(
            f"{what}: the Redis program cache at {self._where} cannot be reached{cause}; "
            "check the server and the URL (NEXUS_PROGRAM_CACHE_REDIS_URL), or raise timeout"
        )

    def _admin(self, what: str, call: Any) -> Any:
        if not self._available():
            raise self._unavailable(what, None)
        try:
            out = call()
        except self._errors as exc:
            if isinstance(exc, self._gone):
                with self._lock:
                    self._retry_at = time.monotonic() + (self._retry_interval or 0.0)
            raise self._unavailable(what, exc) from exc
        self._answered()
        return out

    # -- the five primitives ------------------------------------------------------------

    def _keys(self, digest: bytes) -> tuple[bytes, bytes]:
        member = digest.hex().encode()
        return self._prefix + member, member

    def __getitem__(self, key: bytes | str) -> bytes:
        k = as_key_bytes(key)
        digest = entry_digest(k)
        entry, member = self._keys(digest)
        found = None
        if self._available():
            try:
                found = self._read(
                    keys=[entry, self._lru, self._tick],
                    args=[member, b"1" if self._max else b"0", self._ttl_ms],
                )
            except self._errors as exc:
                self._failed("read", exc)
            else:
                self._answered()
        else:
            self._skipped("read")
        if found is None:
            self._counts.miss()
            raise KeyError(key)
        data, record = bytes(found[0]), bytes(found[1])
        if not record_matches(record, data, digest):
            try:
                self._delete(keys=[entry, self._lru, self._sizes, self._bytes],
                             args=[member, b"1", record])  # fmt: skip
            except self._errors as exc:
                self._failed("read", exc)
            self._counts.miss(corrupt=1)
            raise KeyError(key)
        self._counts.hit()
        return data

    def __setitem__(self, key: bytes | str, value: ProgramCacheValue) -> None:
        k = as_key_bytes(key)
        data = value_to_store(value)
        digest = entry_digest(k)
        entry, member = self._keys(digest)
        cap = self._max
        if cap is not None and len(data) > cap:
            # Superseded: an older entry under this key must not be served.
            try:
                if self._available():
                    self._delete(
                        keys=[entry, self._lru, self._sizes, self._bytes], args=[member, b"0", b""]
                    )
            except self._errors as exc:
                self._failed("write", exc)
            self._counts.skipped_oversize(self, len(data), cap)
            return
        if not self._available():
            self._skipped("write")
            return
        try:
            evicted = self._write(
                keys=[entry, self._lru, self._tick, self._sizes, self._bytes],
                args=[
                    member,
                    data,
                    make_record(data, digest),
                    self._ttl_ms,
                    cap or 0,
                    self._prefix,
                ],
            )
        except self._errors as exc:
            self._failed("write", exc)
            return
        self._answered()
        self._counts.stored()
        self._counts.evicted(int(evicted))

    def __delitem__(self, key: bytes | str) -> None:
        entry, member = self._keys(entry_digest(as_key_bytes(key)))
        deleted = self._admin(
            "del",
            lambda: self._delete(
                keys=[entry, self._lru, self._sizes, self._bytes], args=[member, b"0", b""]
            ),
        )
        if not deleted:
            raise KeyError(key)

    def _scan(self) -> Any:
        pattern = _glob_escape(self._prefix.decode()) + "*"
        return self._client.scan_iter(match=pattern, count=_SCAN_BATCH)

    def _sizes_of_entries(self) -> tuple[int, int]:
        entries = total = 0
        batch: list[bytes] = []

        def flush() -> None:
            nonlocal entries, total
            pipe = self._client.pipeline(transaction=False)
            for name in batch:
                pipe.hstrlen(name, "b")
            for size in pipe.execute():
                entries += 1
                total += int(size)
            batch.clear()

        for name in self._scan():
            batch.append(name)
            if len(batch) >= _SCAN_BATCH:
                flush()
        if batch:
            flush()
        return entries, total

    def __len__(self) -> int:
        return int(self._admin("len", lambda: sum(1 for _ in self._scan())))

    def clear(self) -> None:
        def run() -> None:
            batch: list[bytes] = []
            for name in self._scan():
                batch.append(name)
                if len(batch) >= _SCAN_BATCH:
                    self._client.unlink(*batch)
                    batch.clear()
            if batch:
                self._client.unlink(*batch)
            self._client.unlink(self._lru, self._sizes, self._bytes, self._tick)

        self._admin("clear", run)

    def stats(self) -> CacheStats:
        """Counters and the namespace's size. Never raises: while the server does not
        answer, ``entries`` and ``bytes`` are those last measured (see :attr:`reachable`)."""
        try:
            self._last_size = self._admin("stats", self._sizes_of_entries)
        except CacheUnavailableError:
            pass
        return self._counts.snapshot(*self._last_size)

    @property
    def reachable(self) -> bool:
        """Whether the server answered the last call (False during an outage)."""
        return not self._warned and self._retry_at == 0.0

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        return (
            f"RedisProgramCache({self._where!r}, namespace={self.namespace!r}, "
            f"max_size_bytes={self._max})"
        )
