"""Server settings, tickets, allowed roots and the error wire format, in process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from nexus_cache.errors import (
    AdmissionError,
    ConfigError,
    ServerError,
)
from nexus_cache.server.settings import ServerSettings, is_loopback, load_settings
from nexus_cache.server.tickets import parse_ticket, source_allowed
from nexus_cache.server.wire import (
    attach_diagnostics,
    decode_error,
    encode_error,
    encode_ticket,
    split_diagnostics,
)
from nexus_cache.service import Count, ServiceConfig


def test_allowed_roots_resolve_links_and_respect_path_boundaries(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "database").mkdir()
    secret = tmp_path / "secret.parquet"
    secret.write_bytes(b"")
    os.symlink(secret, data / "link.parquet")
    roots = [str(data), "s3://bucket/lake"]
    assert source_allowed(str(data / "a.parquet"), roots)
    assert source_allowed(str(data), roots)
    assert source_allowed(f"file://{data}/x/y.parquet", roots)
    assert source_allowed(str(data / "x" / ".." / "a.parquet"), roots)
    assert not source_allowed(str(data / ".." / "secret.parquet"), roots)
    assert not source_allowed(str(data / "link.parquet"), roots)  # points outside
    assert not source_allowed(str(tmp_path / "database" / "a.parquet"), roots)
    assert source_allowed("s3://bucket/lake/2024/a.parquet", roots)
    assert source_allowed("S3://bucket/lake/", roots)
    assert not source_allowed("s3://bucket/lakehouse/a.parquet", roots)
    assert not source_allowed("gs://bucket/lake/a.parquet", roots)
    # fsspec's other name of the local filesystem is a local path, resolved
    assert source_allowed(f"local://{data}/a.parquet", roots)
    assert source_allowed(f"FILE://{data}/a.parquet", roots)
    assert not source_allowed(f"local://{data}/../secret.parquet", roots)
    assert not source_allowed(f"local://{data}/link.parquet", roots)
    # a store may resolve dot segments: never allowed in a URL
    assert not source_allowed("s3://bucket/lake/../secret/a.parquet", roots)
    assert not source_allowed("s3://bucket/lake/./a.parquet", roots)
    # no path can be made of these: refused, never an exception
    assert not source_allowed(f"{data}/a\x00.parquet", roots)
    assert not source_allowed(f"{data}/\ud800.parquet", roots)
    assert not source_allowed(f"nexus::{data}/a.parquet", roots)


def test_ticket_size_json_and_device_envelope(tmp_path: Path) -> None:
    query = {"type": "count", "source": str(tmp_path / "a.parquet")}
    raw = encode_ticket(query, device=1)
    parsed, device = parse_ticket(raw, max_bytes=1 << 16, allowed_roots=None)
    assert parsed == Count(str(tmp_path / "a.parquet"))
    assert device == 1
    with pytest.raises(ConfigError, match="over max_ticket_bytes=16 "):
        parse_ticket(raw, max_bytes=16, allowed_roots=None)
    with pytest.raises(ConfigError, match="query JSON is malformed"):
        parse_ticket(b"\xff\xfe", max_bytes=1 << 16, allowed_roots=None)
    with pytest.raises(ConfigError, match="unknown field"):
        parse_ticket(
            json.dumps({"query": query, "priority": 1}).encode(),
            max_bytes=1 << 16,
            allowed_roots=None,
        )
    for bad in (True, -1, "0"):
        with pytest.raises(ConfigError, match="ticket device="):
            parse_ticket(
                json.dumps({"query": query, "device": bad}).encode(),
                max_bytes=1 << 16,
                allowed_roots=None,
            )
    with pytest.raises(ConfigError, match="outside this server's allowed_roots"):
        parse_ticket(raw, max_bytes=1 << 16, allowed_roots=[str(tmp_path / "elsewhere")])


def test_settings_validate_where_they_enter(tmp_path: Path) -> None:
    assert ServerSettings().url == "grpc://127.0.0.1:8815"
    assert ServerSettings(host="::1", port=1).url == "grpc://[::1]:1"
    for field, value in (
        ("port", 70000),
        ("port", True),
        ("metrics_port", -1),
        ("max_running_queries", 0),
        ("queue_timeout_s", float("nan")),
        ("shutdown_timeout_s", float("inf")),
        ("shutdown_timeout_s", -1),
        ("max_ticket_bytes", 0),
        ("token", " "),
        ("allowed_roots", "/data"),
    ):
        with pytest.raises(ConfigError):
            ServerSettings(**{field: value})
    with pytest.raises(ConfigError, match="--tls-cert and --tls-key go together"):
        ServerSettings(tls_cert=tmp_path / "c.pem")
    with pytest.raises(ConfigError, match=r"--tls-cert=.* is not a readable file"):
        ServerSettings(tls_cert=tmp_path / "c.pem", tls_key=tmp_path / "k.pem")


def test_settings_from_toml_environment_and_options(tmp_path: Path) -> None:
    toml = tmp_path / "nexus.toml"
    toml.write_text(
        'backend = "host"\n[server]\nallowed_roots = ["/data"]\nmax_running_queries = 2\n'
    )
    settings = load_settings(
        toml, {"NEXUS_SERVER_MAX_TICKET_BYTES": "1K", "NEXUS_SERVER_TOKEN": " t "}, port=9
    )
    assert settings.allowed_roots == ("/data",)
    assert settings.max_running_queries == 2
    assert settings.max_ticket_bytes == 1024
    assert settings.token == "t"
    assert settings.port == 9
    # the service reads the same file and leaves the [server] table to the server
    assert ServiceConfig.load(toml, environ={}).backend == "host"
    with pytest.raises(ConfigError, match="NEXUS_SERVER_MAX_RUNNING_QUERIES='many'"):
        load_settings(None, {"NEXUS_SERVER_MAX_RUNNING_QUERIES": "many"})
    with pytest.raises(ConfigError, match="NEXUS_SERVER_QUEUE_TIMEOUT_S='nan' is not accepted"):
        load_settings(None, {"NEXUS_SERVER_QUEUE_TIMEOUT_S": "nan"})
    toml.write_text("[server]\nport = 1\n")
    with pytest.raises(ConfigError, match=r"\[server\]: unknown key 'port'"):
        load_settings(toml, {})


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("max_running_queries = 0", "[server]: max_running_queries=0 is not accepted"),
        ("queue_timeout_s = -1", "[server]: queue_timeout_s=-1 is not accepted"),
        ('max_ticket_bytes = "lots"', "[server]: max_ticket_bytes='lots'"),
        ("allowed_roots = 5", "[server] allowed_roots=5 is not accepted"),
    ],
)
def test_a_bad_server_value_in_the_file_names_the_file(
    tmp_path: Path, line: str, said: str
) -> None:
    # the message named the NEXUS_SERVER_* variable, which was not set, and not the file
    toml = tmp_path / "nexus.toml"
    toml.write_text(f"[server]\n{line}\n")
    with pytest.raises(ConfigError) as exc:
        load_settings(toml, {})
    assert str(exc.value).startswith(f"{toml} {said}")


def test_exposure_needs_a_token_or_an_explicit_opt_out() -> None:
    assert is_loopback("127.0.0.1")
    assert is_loopback("localhost")
    assert is_loopback("::1")
    assert not is_loopback("0.0.0.0")
    assert not is_loopback("example.org")
    with pytest.raises(ConfigError, match="--allow-unauthenticated"):
        ServerSettings(host="0.0.0.0").check_exposure()
    ServerSettings(host="0.0.0.0", token="t").check_exposure()
    ServerSettings(host="0.0.0.0", allow_unauthenticated=True).check_exposure()
    ServerSettings(host="127.0.0.1").check_exposure()


def test_errors_travel_as_their_class_and_message() -> None:
    message, info = encode_error(AdmissionError("a grant   of\n 8 B"))
    assert message == "a grant of 8 B"
    again = decode_error(info, "fallback")
    assert type(again) is AdmissionError
    assert str(again) == message
    _, info = encode_error(FileNotFoundError("source 'x' does not exist"))
    assert type(decode_error(info, "")) is FileNotFoundError
    # names outside the package's hierarchy never pick a class
    for name in ("SystemExit", "object", "KeyboardInterrupt", "__class__"):
        forged = json.dumps({"error": name, "message": "m"}).encode()
        assert type(decode_error(forged, "")) is ServerError
    assert str(decode_error(b"not json", "plain text")) == "plain text"


def test_diagnostics_ride_in_the_schema_metadata_and_come_off_again() -> None:
    table = pa.table({"a": [1, 2]}).replace_schema_metadata({b"kept": b"yes"})
    schema = attach_diagnostics(table, {"rows": 2})
    carried = table.replace_schema_metadata(schema.metadata)
    back, document = split_diagnostics(carried)
    assert document == {"rows": 2}
    assert back.schema.metadata == {b"kept": b"yes"}
    with pytest.raises(ServerError, match="no diagnostics"):
        split_diagnostics(pa.table({"a": [1]}))


def test_results_stream_in_batches_of_a_few_mib_whatever_their_chunks() -> None:
    import numpy as np

    from nexus_cache.server._stream import coalesced

    table = pa.Table.from_batches(
        pa.table({"a": np.arange(1000), "b": np.arange(1000.0)}).to_batches(max_chunksize=70)
    )
    batches = list(coalesced(table, 300))
    assert [b.num_rows for b in batches] == [350, 350, 300]
    assert pa.Table.from_batches(batches).equals(table)
    assert [b.num_rows for b in coalesced(table.combine_chunks(), 400)] == [400, 400, 200]
    empty = pa.Table.from_batches([table.to_batches()[0].slice(0, 0)] * 3)
    assert list(coalesced(empty, 10)) == []  # the stream still carries the schema


def test_the_trim_gives_freed_heap_pages_back_to_the_system() -> None:
    """What the server calls every 0.5 s once queries finished: freed blocks in
    the middle of glibc's heap (which freeing them does not return) leave the
    process's resident memory."""
    import ctypes
    import platform

    from nexus_cache.server.lifecycle import freed_memory_trim

    trim = freed_memory_trim()
    if platform.libc_ver()[0] != "glibc" or not Path("/proc/self/statm").exists():
        pytest.skip("malloc_trim is glibc's; resident memory is read from /proc")
    assert trim is not None

    def resident() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 64 << 10, 1024  # 64 MiB in heap blocks, under the mmap threshold
    blocks = [libc.malloc(size) for _ in range(count + 1)]
    assert all(blocks)
    for block in blocks:
        ctypes.memset(block, 1, size)
    for block in blocks[:count]:  # the last one holds the heap's top: no trim on free
        libc.free(block)
    before = resident()
    trim()
    after = resident()
    libc.free(blocks[count])
    assert before - after >= (count * size) // 2, (before, after)
