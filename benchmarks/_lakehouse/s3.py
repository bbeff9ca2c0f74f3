"""moto's S3 server on loopback, s3fs clients of it, and counters of what they send."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import socket
from pathlib import Path
from typing import Any

__all__ = [
    "BUCKET",
    "CTX",
    "COUNTS",
    "MotoServer",
    "install_counters",
    "make_s3fs",
    "upload",
    "upload_many",
]

CTX = mp.get_context("spawn")
BUCKET = "nexus-bench"
_DUMMY_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}

#: requests this process sent, by s3 method (``get_object``, ``head_object``,
#: ``list_objects_v2``...), plus ``s3_bytes`` of GET bodies read and
#: ``local_get_file`` whole-file copies of the local remote; see install_counters
COUNTS: dict[str, int] = {}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _moto_main(conn: Any) -> None:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    conn.send_bytes(str(port).encode())
    with contextlib.suppress(EOFError):
        conn.recv_bytes()
    server.stop()


class MotoServer:
    """moto's S3 server in a child process, so that it does not share our GIL.

    :meth:`start` returns at once (the server boots while the caller works);
    :meth:`endpoint` waits for it. Dummy credentials go into our environment,
    which the spawned readers of the concurrency figure inherit.
    """

    def __init__(self) -> None:
        os.environ.update(_DUMMY_AWS)
        self._conn, child = CTX.Pipe()
        self._proc = CTX.Process(target=_moto_main, args=(child,), daemon=True)
        self._url: str | None = None

    def start(self) -> MotoServer:
        self._proc.start()
        return self

    def endpoint(self) -> str:
        if self._url is None:
            if not self._conn.poll(120):
                raise RuntimeError("the moto server did not start within 120 s")
            self._url = f"http://127.0.0.1:{int(self._conn.recv_bytes())}"
        return self._url

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send_bytes(b"stop")
        self._proc.join(15)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(15)


def make_s3fs(endpoint: str) -> Any:
    import s3fs

    return s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True)


def _client(endpoint: str) -> Any:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)
    return client


def upload(endpoint: str, path: Path) -> str:
    """Put ``path`` into the bench bucket under its name; its ``bucket/key``."""
    return upload_many(endpoint, [path], "")[0]


def upload_many(endpoint: str, paths: list[Path], prefix: str) -> list[str]:
    """Put every file under ``prefix`` (one PUT each); their ``bucket/key`` paths."""
    client = _client(endpoint)
    out = []
    for path in paths:
        key = f"{prefix}{path.name}"
        with open(path, "rb") as f:  # one PUT: moto assembles multipart uploads slowly
            client.put_object(Bucket=BUCKET, Key=key, Body=f)
        out.append(f"{BUCKET}/{key}")
    return out


_installed = False


def install_counters() -> None:
    """Count what this process asks of the remotes (every s3fs request; local get_file)."""
    global _installed
    if _installed:
        return
    _installed = True
    import s3fs
    from aiobotocore.response import AioStreamingBody
    from fsspec.implementations.local import LocalFileSystem

    call_s3 = s3fs.S3FileSystem._call_s3

    async def counting_call_s3(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        COUNTS[method] = COUNTS.get(method, 0) + 1
        return await call_s3(self, method, *args, **kwargs)

    # Bytes are counted as the response bodies are read, not from Content-Length:
    # s3fs opens a full GET and closes it unread when it switches to ranged parts.
    body_read = AioStreamingBody.read

    async def counting_body_read(self: Any, *args: Any, **kwargs: Any) -> Any:
        data = await body_read(self, *args, **kwargs)
        COUNTS["s3_bytes"] = COUNTS.get("s3_bytes", 0) + len(data)
        return data

    get_file = LocalFileSystem.get_file

    def counting_get_file(self: Any, path1: Any, path2: Any, *args: Any, **kwargs: Any) -> Any:
        COUNTS["local_get_file"] = COUNTS.get("local_get_file", 0) + 1
        return get_file(self, path1, path2, *args, **kwargs)

    s3fs.S3FileSystem._call_s3 = counting_call_s3  # type: ignore[method-assign]
    AioStreamingBody.read = counting_body_read  # type: ignore[method-assign]
    LocalFileSystem.get_file = counting_get_file  # type: ignore[method-assign]
