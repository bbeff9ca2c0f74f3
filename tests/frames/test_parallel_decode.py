"""Row groups decoded by a pool of threads: same frame as one decoder, bounded
memory in flight, every source kind, settings checked where they enter, and
no decoder thread left behind on any failure."""

from __future__ import annotations

import gc
import io
import os
import threading
import time
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_cache.backends import HostBackend
from nexus_cache.errors import ConfigError, SourceFormatError
from nexus_cache.frames import DecodeStats, decode_parquet, read_parquet
from nexus_cache.frames._pool import RowGroupPool, decode_settings
from nexus_cache.lakehouse import LakehouseCache, LakehouseCacheConfig, ReadMode

from ._tables import assert_same_table, tables


def _domain(total: int = 256 << 20):
    return HostBackend(device_total_bytes=total).create_domain(0)


def _decoders() -> int:
    return sum(t.name.startswith("nexus-decode") for t in threading.enumerate())


def _sample(n: int) -> pa.Table:
    rng = np.random.default_rng(3)
    return pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "x": pa.array(rng.normal(size=n), mask=rng.random(n) < 0.2),
            "name": pa.array([f"n{i % 97}" * (i % 3) for i in range(n)]),
            "cat": pa.array([f"c{i % 5}" for i in range(n)]).dictionary_encode(),
            "flag": pa.array(rng.random(n) < 0.5),
        }
    )


def _write(path: Path, table: pa.Table, row_group_size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    past = time.time() - 60  # old enough for the lakehouse to trust its identity
    os.utime(path, (past, past))
    return path


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_any_thread_count_gives_the_frame_read_table_gives(tmp_path: Path, threads: int) -> None:
    path = _write(tmp_path / "t.parquet", _sample(9000), row_group_size=700)
    stats = DecodeStats()
    frame = decode_parquet(str(path), domain=_domain(), threads=threads, stats=stats)
    assert_same_table(frame.to_arrow(), pq.read_table(path))
    assert stats.row_groups == 13
    assert stats.decode_threads == threads


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(table=tables(max_rows=80, max_columns=4, parquet=True), data=st.data())
def test_random_tables_decode_alike_on_several_threads(
    tmp_path: Path, table: pa.Table, data: Any
) -> None:
    path = tmp_path / f"h{data.draw(st.integers(0, 1 << 30))}.parquet"
    pq.write_table(table, path, row_group_size=data.draw(st.integers(1, 9)))
    window = data.draw(st.sampled_from([1, 4096, 1 << 20]))
    frame = decode_parquet(str(path), domain=_domain(), threads=4, window_bytes=window)
    assert_same_table(frame.to_arrow(), pq.read_table(path))
    path.unlink()


def test_every_source_kind_decodes_alike(tmp_path: Path) -> None:
    path = _write(tmp_path / "src" / "t.parquet", _sample(6000), row_group_size=500)
    expected = pq.read_table(path)
    with open(path, "rb") as handle:  # a regular file's descriptor is mapped
        assert_same_table(decode_parquet(handle, domain=_domain()).to_arrow(), expected)
    stream = io.BytesIO(path.read_bytes())  # no descriptor, no size: one reader
    stats = DecodeStats()
    assert_same_table(
        decode_parquet(stream, domain=_domain(), threads=4, stats=stats).to_arrow(), expected
    )
    assert stats.decode_threads == 1
    config = LakehouseCacheConfig(
        root=tmp_path / "root", policy="fill_before_read", max_bytes=1 << 30
    )
    with LakehouseCache(config) as cache:
        local = DecodeStats()  # a local entry: its mapping is shared by the threads
        frame = read_parquet(str(path), domain=_domain(), lake=cache, threads=3, stats=local)
        assert local.lakehouse.read_mode is ReadMode.LOCAL
        assert local.decode_threads == 3
        assert_same_table(frame.to_arrow(), expected)
    with LakehouseCache(LakehouseCacheConfig()) as cache:  # no root: a remote read
        remote = DecodeStats()
        frame = read_parquet(str(path), domain=_domain(), lake=cache, threads=3, stats=remote)
        assert remote.lakehouse.read_mode is ReadMode.REMOTE
        assert remote.decode_threads == 3  # the local file is mapped
        assert_same_table(frame.to_arrow(), expected)
        memory = fsspec.filesystem("memory")
        memory.pipe("/decode-kinds/t.parquet", path.read_bytes())
        try:  # a store's object larger than the window: streamed by one reader
            tight = DecodeStats()
            frame = read_parquet(
                "/decode-kinds/t.parquet",
                fs=memory,
                domain=_domain(),
                lake=cache,
                threads=3,
                window_bytes=1024,
                stats=tight,
            )
            assert tight.decode_threads == 1
            assert_same_table(frame.to_arrow(), expected)
        finally:
            memory.rm("/decode-kinds", recursive=True)


@pytest.mark.parametrize(
    "settings",
    [
        {},  # no root: the source file is read directly
        {"policy": "disabled"},  # a root, a miss read from the source
        {"policy": "read_through"},  # the same, warming the cache behind it
        {"policy": "fill_before_read"},  # a root: the filled entry
    ],
)
def test_a_local_file_is_memory_mapped_with_or_without_a_root(
    tmp_path: Path, settings: dict[str, Any]
) -> None:
    # Larger than the decode window, so the one way to several decoders is a
    # shared mapping of the file: a stream of it would be read by one thread.
    path = _write(tmp_path / "src" / "t.parquet", _sample(6000), row_group_size=500)
    root = tmp_path / "root" if settings else None
    config = LakehouseCacheConfig(root=root, max_bytes=1 << 30, **settings)
    with LakehouseCache(config) as cache:
        stats = DecodeStats()
        frame = read_parquet(
            str(path), domain=_domain(), lake=cache, threads=3, window_bytes=1024, stats=stats
        )
        assert stats.decode_threads == 3
        assert_same_table(frame.to_arrow(), pq.read_table(path))


class _Recorder:
    """A ParquetFile stand-in that records which column chunks were decoded."""

    def __init__(self, pf: pq.ParquetFile, started: list[tuple[int, str]]) -> None:
        self._pf = pf
        self._started = started

    def read_row_group(self, group: int, *, columns: list[str], **kwargs: Any) -> pa.Table:
        self._started.extend((group, c) for c in columns)
        return self._pf.read_row_group(group, columns=columns, **kwargs)


def test_the_window_bounds_the_column_chunks_in_flight(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.parquet", _sample(8000), row_group_size=500)
    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    size = {
        (g, pf.metadata.row_group(g).column(i).path_in_schema): (
            pf.metadata.row_group(g).column(i).total_uncompressed_size
        )
        for g in range(16)
        for i in range(len(names))
    }
    window = sum(size[0, c] for c in names) * 3 // 2  # one and a half row groups
    started: list[tuple[int, str]] = []
    pool = RowGroupPool(
        lambda: _Recorder(pq.ParquetFile(path), started),  # type: ignore[arg-type,return-value]
        pf,
        range(16),
        names,
        threads=4,
        window_bytes=window,
        on_decoded=lambda seconds: None,
    )
    consumed = 0
    for rows, pieces in pool:
        assert rows == 500
        assert len(pieces) == len(names)
        consumed += 1
        ahead = sum(size[unit] for unit in started if unit[0] >= consumed)
        assert ahead <= window + max(size.values())
    assert consumed == 16
    assert sorted(started) == sorted(size)
    assert _decoders() == 0


def test_a_row_group_larger_than_the_window_still_decodes(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.parquet", _sample(3000), row_group_size=1500)
    frame = decode_parquet(str(path), domain=_domain(), threads=2, window_bytes=1)
    assert_same_table(frame.to_arrow(), pq.read_table(path))


def test_an_interrupt_while_copying_stops_every_decoder_and_frees_the_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nexus_cache.frames import _builder

    path = _write(tmp_path / "t.parquet", _sample(20000), row_group_size=500)
    domain = _domain()
    calls = 0
    add = _builder.ColumnBuilder.add

    def interrupted(self: Any, piece: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 12:
            raise KeyboardInterrupt
        add(self, piece)

    monkeypatch.setattr(_builder.ColumnBuilder, "add", interrupted)
    with pytest.raises(KeyboardInterrupt):
        decode_parquet(str(path), domain=domain, threads=4)
    gc.collect()
    assert _decoders() == 0
    assert domain.counters().used_bytes == 0


def test_a_failing_row_group_reaches_the_caller_and_stops_the_pool(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.parquet", _sample(20000), row_group_size=1000)
    data = bytearray(path.read_bytes())
    column = pq.ParquetFile(path).metadata.row_group(7).column(0)
    start = column.data_page_offset
    data[start : start + column.total_compressed_size] = b"\xff" * column.total_compressed_size
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(bytes(data))
    domain = _domain()
    # Parquet's own corruption error (an OSError) named no file
    with pytest.raises(SourceFormatError, match=r"broken\.parquet.* is corrupt") as caught:
        decode_parquet(str(broken), domain=domain, threads=4)
    assert isinstance(caught.value.__cause__, OSError)
    gc.collect()
    assert _decoders() == 0
    assert domain.counters().used_bytes == 0


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.parquet"
    os.mkfifo(fifo)
    with pytest.raises(SourceFormatError, match=r"pipe\.parquet.*not a regular file"):
        decode_parquet(str(fifo), domain=_domain())


@pytest.mark.parametrize(
    ("variable", "value", "match"),
    [
        ("NEXUS_DECODE_THREADS", "0", "NEXUS_DECODE_THREADS='0'"),
        ("NEXUS_DECODE_THREADS", "1_0", "NEXUS_DECODE_THREADS='1_0'"),
        ("NEXUS_DECODE_THREADS", "two", "from 1 to"),
        ("NEXUS_DECODE_THREADS", "100000", "from 1 to"),
        ("NEXUS_DECODE_WINDOW_BYTES", "-5", "NEXUS_DECODE_WINDOW_BYTES"),
        ("NEXUS_DECODE_WINDOW_BYTES", "nan", "NEXUS_DECODE_WINDOW_BYTES"),
        ("NEXUS_DECODE_WINDOW_BYTES", "0", "NEXUS_DECODE_WINDOW_BYTES"),
    ],
)
def test_bad_variables_name_themselves(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, match: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=match):
        decode_settings()


def test_settings_default_to_the_machine_and_take_the_size_grammar(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NEXUS_DECODE_THREADS", raising=False)
    monkeypatch.delenv("NEXUS_DECODE_WINDOW_BYTES", raising=False)
    threads, window = decode_settings()
    assert 1 <= threads <= 16
    assert window == min(threads * (64 << 20), 1 << 30)
    monkeypatch.setenv("NEXUS_DECODE_THREADS", "3")
    monkeypatch.setenv("NEXUS_DECODE_WINDOW_BYTES", "96MiB")
    assert decode_settings() == (3, 96 << 20)
    assert decode_settings(5, "1GiB") == (5, 1 << 30)  # arguments win over variables
    with pytest.raises(ConfigError, match=r"threads=True"):
        decode_settings(True)  # type: ignore[arg-type]


def test_a_small_read_is_decoded_inline_and_a_large_one_by_the_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few row groups (a filtered scan's) cost more in starting threads than in
    decoding: with no thread count asked for, they are read in the calling thread;
    above the threshold the pool runs as before. Same frame either way."""
    import nexus_cache.frames.decode as decode_module

    monkeypatch.setenv("NEXUS_DECODE_THREADS", "2")
    path = _write(tmp_path / "t.parquet", _sample(9000), row_group_size=700)
    seen: list[int] = []
    real = RowGroupPool._decode

    def spy(self: RowGroupPool, group: int, column: str) -> Any:
        seen.append(_decoders())
        return real(self, group, column)

    monkeypatch.setattr(RowGroupPool, "_decode", spy)
    small = DecodeStats()
    frame = decode_parquet(str(path), domain=_domain(), stats=small)
    assert_same_table(frame.to_arrow(), pq.read_table(path))
    assert small.decode_threads == 1
    assert small.row_groups == 13
    assert seen == []  # no unit went to a pool thread
    monkeypatch.setattr(decode_module, "INLINE_BYTES", 0)
    large = DecodeStats()
    frame = decode_parquet(str(path), domain=_domain(), stats=large)
    assert_same_table(frame.to_arrow(), pq.read_table(path))
    assert large.decode_threads == 2
    assert seen
    assert max(seen) >= 1
    assert _decoders() == 0
