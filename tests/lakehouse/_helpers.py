"""Helpers shared by the lakehouse tests (importable by spawned processes)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def make_s3fs(endpoint: str, **kwargs: Any) -> Any:
    import s3fs

    return s3fs.S3FileSystem(
        client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True, **kwargs
    )


def put_object(endpoint: str, bucket: str, key: str, data: bytes) -> dict[str, Any]:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    return dict(client.put_object(Bucket=bucket, Key=key, Body=data))


def write_old_file(path: Path, data: bytes, age_s: float = 60.0) -> Path:
    """Write ``data`` and backdate its mtime so its local identity is trusted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    past = time.time() - age_s
    os.utime(path, (past, past))
    return path


def make_cache(root: Path | None, **config: Any) -> Any:
    """A LakehouseCache on ``root``; ``max_bytes`` defaults to 1 GiB."""
    from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig

    config.setdefault("max_bytes", 1 << 30)
    return LakehouseCache(LakehouseCacheConfig(root=root, **config))


def fill_counts(cache: Any) -> int:
    return int(cache.events.counts().get("fill_completed", 0))


def entry_files(root: Path) -> list[Path]:
    """Published data files under a cache root."""
    return [p for p in (root / "entries").glob("*/*") if not p.name.endswith(".json")]


# --- bodies of spawned processes (module level so spawn can import them) -------


def worker_read(root: str, source: str, endpoint: str | None, barrier: Any, results: Any) -> None:
    """Read ``source`` under fill_before_read; report digest, diagnostics, fill count."""
    import hashlib

    fs = make_s3fs(endpoint) if endpoint else None
    cache = make_cache(Path(root), policy="fill_before_read", blocking_fill_timeout_s=60.0)
    barrier.wait(timeout=60)
    with cache.open(source, fs=fs) as f:
        digest = hashlib.sha256(f.read()).hexdigest()
        diag = f.diagnostics.to_dict()
    results.put((os.getpid(), digest, diag, fill_counts(cache)))


def worker_open_roots(roots: list[str], barrier: Any, results: Any) -> None:
    """Open each new root at the same moment as the other workers; report failures."""
    failures = []
    for root in roots:
        barrier.wait(timeout=60)
        try:
            make_cache(Path(root), policy="fill_before_read").close()
        except Exception as exc:
            failures.append(f"{root}: {type(exc).__name__}: {exc}")
    results.put(failures)


def worker_slow_fill(root: str, source: str, started: Any) -> None:
    """Fill ``source`` in small, slow chunks so a SIGKILL lands mid-fill."""
    from nexus_cache.lakehouse import _fill as fill

    original = fill._write_chunk
    fill._CHUNK = 64 * 1024

    def slow_write(fd: int, data: bytes) -> None:
        started.set()
        time.sleep(0.002)
        original(fd, data)

    fill._write_chunk = slow_write
    cache = make_cache(Path(root), policy="fill_before_read")
    cache.prefetch(source)
    started.set()
    time.sleep(60)  # wait to be killed


def worker_hold_pin(root: str, source: str, pinned: Any) -> None:
    """Open a hit (which pins it), report, and hang until killed."""
    cache = make_cache(Path(root))
    f = cache.open(source)
    assert f.is_local
    pinned.set()
    time.sleep(60)
    f.close()


def worker_plan_then_read(root: str, source: str, barrier: Any, results: Any) -> None:
    """Plan ``source`` under fill_before_read, wait until every worker has planned,
    then read it; report the read's status and this process's fill count."""
    cache = make_cache(Path(root), policy="fill_before_read", blocking_fill_timeout_s=60.0)
    plan = cache.plan(source)
    barrier.wait(timeout=60)
    with cache.execute(plan) as f:
        f.read()
        status = f.diagnostics.cache_status.value
    cache.close()
    results.put((plan.status.value, status, fill_counts(cache)))
