"""Parquet decode through the lakehouse cache into a frame (host backend), and
reading a cache hit's bytes into a domain."""

from __future__ import annotations

import gc
import io
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_cache.backends import HostBackend
from nexus_cache.errors import BackendUnavailableError, ConfigError, FrameTypeError, LifecycleError
from nexus_cache.frames import (
    DecodeStats,
    DeviceFrame,
    decode_parquet,
    read_parquet,
    read_to_device,
)
from nexus_cache.frames.decode import decoded_schema
from nexus_cache.lakehouse import CacheStatus, LakehouseCache, LakehouseCacheConfig, ReadMode

from ._tables import assert_same_table, tables


def _domain(total: int = 256 << 20):
    return HostBackend(device_total_bytes=total).create_domain(0)


def _write(path: Path, table: pa.Table, row_group_size: int) -> Path:
    """Write Parquet and backdate it, so the lakehouse trusts its local identity."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=max(1, row_group_size))
    past = time.time() - 60
    os.utime(path, (past, past))
    return path


def _cache(root: Path) -> LakehouseCache:
    return LakehouseCache(
        LakehouseCacheConfig(root=root, policy="fill_before_read", max_bytes=1 << 30)
    )


def _sample(n: int = 5000) -> pa.Table:
    rng = np.random.default_rng(7)
    words = [f"w{i}" for i in range(40)]
    return pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "x": pa.array(rng.normal(size=n), mask=rng.random(n) < 0.1),
            "flag": pa.array(rng.random(n) < 0.5, mask=rng.random(n) < 0.05),
            "day": pa.array(rng.integers(0, 20000, n, dtype=np.int32)).view(pa.date32()),
            "ts": pa.array(rng.integers(0, 1 << 40, n)).view(pa.timestamp("us", tz="UTC")),
            "name": pa.array([f"name-{i}" * (i % 4) for i in range(n)], mask=rng.random(n) < 0.1),
            "cat": pa.array([words[i % 40] for i in range(n)]).dictionary_encode(),
        }
    )


@pytest.mark.parametrize(
    ("columns", "row_groups"),
    [(None, None), (["name", "id"], None), (["cat", "flag", "ts"], [3, 1]), (["x"], [])],
)
def test_decode_through_a_lakehouse_root_equals_read_table(
    tmp_path: Path, columns: list[str] | None, row_groups: list[int] | None
) -> None:
    source = _write(tmp_path / "src" / "t.parquet", _sample(), row_group_size=1000)
    domain = _domain()
    with _cache(tmp_path / "root") as cache:
        stats = DecodeStats()
        frame = read_parquet(
            str(source),
            domain=domain,
            lake=cache,
            columns=columns,
            row_groups=row_groups,
            stats=stats,
        )
        again = DecodeStats()
        read_parquet(str(source), domain=domain, lake=cache, columns=columns, stats=again)
    if row_groups is None:
        expected = pq.read_table(source, columns=columns)
    else:
        expected = pq.ParquetFile(source).read_row_groups(row_groups, columns=columns)
    assert_same_table(frame.to_arrow(), expected)
    # the first read filled the root, then read the local copy; the second hit it
    assert stats.lakehouse.cache_status is CacheStatus.MISS
    assert stats.lakehouse.read_mode is ReadMode.LOCAL
    assert again.lakehouse.cache_status is CacheStatus.HIT
    assert stats.row_groups == (5 if row_groups is None else len(row_groups))
    assert stats.rows == frame.num_rows
    # every byte was copied in, or (a whole fixed-width column) taken as Arrow decoded it
    moved = stats.transfer.h2d_bytes + stats.transfer.adopted_bytes
    assert moved >= frame.nbytes - 2 * len(frame.columns) * 8


def test_decoded_frame_is_fully_accounted_in_the_domain(tmp_path: Path) -> None:
    source = _write(tmp_path / "t.parquet", _sample(), row_group_size=700)
    domain = _domain()
    frame = decode_parquet(str(source), domain=domain)
    gc.collect()
    # only the frame is live, and on host memory string pieces are copied once,
    # into the joined buffer, so nothing else was ever allocated in the domain
    assert domain.counters().used_bytes == domain.measured_bytes(frame.device_arrays())
    assert domain.counters().allocated_bytes == domain.counters().used_bytes
    frame.release()
    gc.collect()
    assert domain.counters().used_bytes == 0


def test_a_host_decode_takes_the_fixed_width_columns_arrow_decoded_without_a_copy(
    tmp_path: Path,
) -> None:
    """A read decoded inline (a few row groups) hands each column over in one piece:
    on the host backend a whole fixed-width column's piece becomes the frame's buffer
    as Arrow decoded it (booked in the domain as an allocation of its size, gone with
    the frame), with no second copy; the rest is copied in. Same frame either way."""
    source = _write(tmp_path / "t.parquet", _sample(), row_group_size=1000)
    domain = _domain()
    stats = DecodeStats()
    columns = ["id", "x", "ts", "name"]
    frame = decode_parquet(
        str(source), domain=domain, columns=columns, row_groups=[3, 1], stats=stats
    )
    expected = pq.ParquetFile(source).read_row_groups([3, 1], columns=columns)
    assert_same_table(frame.to_arrow(), expected)
    assert stats.row_groups == 2
    # id and ts (no nulls) and x's values (its validity is unpacked, so copied) are taken
    assert stats.transfer.adopted_bytes == 3 * 2000 * 8
    taken = [frame.column(c).data for c in ("id", "x", "ts")]
    assert all(a.flags.writeable for a in taken)
    gc.collect()
    # booked exactly as allocations of the domain: the frame is all that is live
    assert domain.counters().used_bytes == domain.measured_bytes(frame.device_arrays())
    copy = frame.copy_into(domain)  # a cache entry's copy: its own buffers
    assert not any(np.shares_memory(a, b) for a in taken for b in copy.device_arrays())
    assert_same_table(copy.to_arrow(), expected)
    copy.release()
    del taken
    frame.release()
    gc.collect()
    assert domain.counters().used_bytes == 0
    domain.close()  # nothing left behind
    # a dictionary column comes in a piece per row group (each its dictionary):
    # every column is then built from row-group pieces, copied in
    stats = DecodeStats()
    columns.append("cat")
    frame = decode_parquet(
        str(source), domain=_domain(), columns=columns, row_groups=[3, 1], stats=stats
    )
    assert_same_table(
        frame.to_arrow(), pq.ParquetFile(source).read_row_groups([3, 1], columns=columns)
    )
    assert stats.transfer.adopted_bytes == 0


def test_a_frame_from_a_callers_arrow_table_is_a_copy(tmp_path: Path) -> None:
    """Only a decoder's own buffers are taken as they are: a frame built from a table
    the caller holds never shares its memory."""
    table = _sample(1000).select(["id", "ts"])
    frame = DeviceFrame.from_arrow(table, domain=_domain())
    for name in ("id", "ts"):
        values = np.frombuffer(table.column(name).chunk(0).buffers()[1], np.uint8)
        assert not np.shares_memory(frame.column(name).data, values)
    frame.release()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(table=tables(max_rows=60, max_columns=5, parquet=True), data=st.data())
def test_random_tables_decode_like_read_table(tmp_path: Path, table: pa.Table, data) -> None:
    path = tmp_path / f"h{data.draw(st.integers(0, 1 << 30))}.parquet"
    pq.write_table(table, path, row_group_size=data.draw(st.integers(1, 25)))
    names = table.column_names
    keep = data.draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    frame = decode_parquet(str(path), domain=_domain(), columns=keep)
    assert_same_table(frame.to_arrow(), pq.read_table(path, columns=keep))
    path.unlink()


def test_bad_requests_name_what_to_change(tmp_path: Path) -> None:
    source = _write(tmp_path / "t.parquet", _sample(100), row_group_size=50)
    with pytest.raises(ConfigError, match=r"\['nope'\].*columns: \['id'"):
        decode_parquet(str(source), domain=_domain(), columns=["id", "nope"])
    with pytest.raises(ConfigError, match=r"row_groups \[2\].*has 2"):
        decode_parquet(str(source), domain=_domain(), row_groups=[0, 2])


def test_an_unsupported_column_fails_before_any_allocation(tmp_path: Path) -> None:
    table = pa.table({"a": [1, 2], "l": pa.array([[1], [2, 3]])})
    source = _write(tmp_path / "t.parquet", table, row_group_size=1)
    domain = _domain()
    with pytest.raises(FrameTypeError, match="'l'"):
        decode_parquet(str(source), domain=domain)
    assert domain.counters().allocations == 0
    frame = decode_parquet(str(source), domain=domain, columns=["a"])
    assert frame.to_arrow().column("a").to_pylist() == [1, 2]


class _FailingFile(io.RawIOBase):
    """A file whose reads of byte ``limit`` fail, as a dying disk or network would."""

    def __init__(self, data: bytes, limit: int) -> None:
        self._data, self._limit, self._pos = data, limit, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = {0: pos, 1: self._pos + pos, 2: len(self._data) + pos}[whence]
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buf) -> int:
        end = min(self._pos + len(buf), len(self._data))
        if self._pos <= self._limit < end:
            raise OSError("injected read failure")
        n = end - self._pos
        buf[:n] = self._data[self._pos : end]
        self._pos = end
        return n


def test_a_decoder_error_reaches_the_caller_and_frees_everything(tmp_path: Path) -> None:
    source = _write(tmp_path / "t.parquet", _sample(20000), row_group_size=2000)
    data = source.read_bytes()
    meta = pq.ParquetFile(source).metadata
    limit = meta.row_group(3).column(0).data_page_offset  # row groups 0..2 decode fine
    domain = _domain()
    threads = threading.active_count()
    with pytest.raises(OSError, match="injected"):
        decode_parquet(_FailingFile(data, limit), domain=domain)
    gc.collect()
    assert domain.counters().allocations > 0
    assert domain.counters().used_bytes == 0
    assert threading.active_count() == threads


# -- read_to_device -------------------------------------------------------------------


def test_read_to_device_reads_a_hit_into_the_domain(tmp_path: Path) -> None:
    payload = os.urandom(300_000)
    source = tmp_path / "src" / "blob.bin"
    source.parent.mkdir()
    source.write_bytes(payload)
    past = time.time() - 60
    os.utime(source, (past, past))
    domain = _domain()
    with _cache(tmp_path / "root") as cache, cache.open(str(source)) as handle:
        assert handle.is_local
        array = read_to_device(handle, domain=domain)
        assert bytes(array) == payload
        assert domain.allocation_bytes(array) >= len(payload)
        out = domain.empty(len(payload) + 100, np.uint8)
        assert read_to_device(handle, domain=domain, out=out) is out
        assert bytes(out[: len(payload)]) == payload
        with pytest.raises(LifecycleError):
            read_to_device(handle, domain=domain, out=np.empty(len(payload), np.uint8))


def test_read_to_device_of_a_remote_read_uses_staging_and_refuses_kvikio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload = os.urandom(5000)
    source = tmp_path / "blob.bin"
    source.write_bytes(payload)  # fresh file: its identity is not trusted, reads go remote
    domain = _domain()
    config = LakehouseCacheConfig(root=tmp_path / "root", policy="read_through", max_bytes=1 << 20)
    cache = LakehouseCache(config)
    with cache, cache.open(str(source)) as handle:
        assert not handle.is_local
        assert bytes(read_to_device(handle, domain=domain)) == payload
        with pytest.raises(io.UnsupportedOperation, match="local"):
            read_to_device(handle, domain=domain, use_kvikio=True)
    monkeypatch.setitem(sys.modules, "kvikio", None)  # import kvikio -> ImportError
    with open(source, "rb") as f, pytest.raises(BackendUnavailableError, match="kvikio"):
        read_to_device(f, domain=domain, use_kvikio=True)


@pytest.mark.parametrize(
    ("slot_bytes", "slots", "match"),
    [
        (1024, 3, "too small"),
        ("-1M", 3, "slot_bytes"),
        (True, 3, "slot_bytes"),
        (4096, 1, "slots"),
    ],
)
def test_staging_settings_are_checked_where_they_enter(slot_bytes, slots, match) -> None:
    from nexus_cache.frames import open_transfer

    with pytest.raises(ConfigError, match=match):
        open_transfer(_domain(), slot_bytes=slot_bytes, slots=slots)


def test_slot_sizes_take_the_size_grammar(tmp_path: Path) -> None:
    source = _write(tmp_path / "t.parquet", _sample(100), row_group_size=50)
    frame = decode_parquet(str(source), domain=_domain(), slot_bytes="64KiB")
    assert frame.num_rows == 100


@pytest.mark.parametrize("int96", [False, True])
@pytest.mark.parametrize(
    ("columns", "read_dictionary"),
    [(None, None), (["name", "id", "name"], ["name"]), (["ts", "cat"], None), ([], None)],
)
def test_decoded_schema_is_the_schema_arrow_reads(
    tmp_path: Path, columns: list[str] | None, read_dictionary: list[str] | None, int96: bool
) -> None:
    """The schema a decode gives (types, field and schema metadata, dictionary reads,
    a name given twice read once) is the one Arrow's reader gives, with no row read."""
    table = _sample(50)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"k": b"v"})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=20, use_deprecated_int96_timestamps=int96)
    pf = pq.ParquetFile(path, read_dictionary=read_dictionary)
    expected = pf.read(columns=columns).schema
    assert decoded_schema(pf, columns).equals(expected, check_metadata=True)
    frame = decode_parquet(
        str(path), domain=_domain(), columns=columns, read_dictionary=read_dictionary
    )
    assert frame.to_arrow().schema.equals(expected, check_metadata=True)
