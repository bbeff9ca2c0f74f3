"""The fused filter (``frames.fused_filter``): the device flow run on the host with
the kernels' NumPy ports (``tests/frames/_fused_port.py``), against
``filter_mask`` and ``gather_table``; its launch and wait budget; the filters it
leaves to the generic path; the kernels compiled by NVRTC. (On a GPU:
tests/gpu/test_tables_gpu.py.)"""

from __future__ import annotations

import gc
import importlib
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from tests.frames import _fused_port
from tests.frames.gpudecode import _emulator

from nexus_cache.backends import HostBackend
from nexus_cache.frames import DeviceFrame
from nexus_cache.frames.fused_filter import FUSED_KERNELS, FUSED_SOURCE, MAX_OUTPUTS
from nexus_cache.frames.gather import gather_table
from nexus_cache.tables import canonical_filter, filter_mask

_fused = importlib.import_module("nexus_cache.frames.fused_filter")

_INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
_TYPES: dict[str, pa.DataType] = {
    **{name: getattr(pa, name)() for name in _INTS},
    "float32": pa.float32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "ts": pa.timestamp("ms"),
    "day": pa.date32(),
}
_OPS = ["=", "!=", "<", "<=", ">", ">="]


def _values(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    arrow_type = _TYPES[name]
    if name == "bool":
        return rng.random(n) < 0.5
    if name.startswith("float"):
        return rng.choice([-1.5, 0.0, 0.25, 2.0, 1e10, np.nan], n).astype(name)
    if name in ("ts", "day"):
        return rng.integers(-5, 6, n)
    info = np.iinfo(arrow_type.to_pandas_dtype())
    picks = np.array([info.min, info.max, 0, 1, 2, 3, info.max - 1], dtype=object)
    return rng.choice(picks, n)


def _table(n: int, rng: np.random.Generator, nulls: bool) -> pa.Table:
    columns = {}
    for name, arrow_type in _TYPES.items():
        values = _values(name, n, rng)
        mask = (rng.random(n) < 0.3) if nulls and name != "int8" else None
        if name in ("ts", "day"):
            storage = pa.int64() if name == "ts" else pa.int32()
            columns[name] = pa.array(values, storage, mask=mask).cast(arrow_type)
        else:
            columns[name] = pa.array(values.tolist(), arrow_type, mask=mask)
    return pa.table(columns)


def _constant(name: str, rng: np.random.Generator, table: pa.Table | None) -> Any:
    """A value of column ``name``: one of its rows' mostly, else an edge."""
    if table is not None and table.num_rows and rng.random() < 0.7:
        value = table.column(name)[int(rng.integers(table.num_rows))].as_py()
        if value is not None and not (isinstance(value, float) and np.isnan(value)):
            if name == "ts":
                return int(pa.scalar(value, _TYPES[name]).cast(pa.int64()).as_py())
            if name == "day":
                return int(pa.scalar(value, _TYPES[name]).cast(pa.int32()).as_py())
            return value
    if name == "bool":
        return bool(rng.random() < 0.5)
    if name.startswith("float"):
        return float(rng.choice([-1.5, 0.1, 0.25, 2.0, 3.4e38, 1e10]))
    if name in _INTS:
        return float(rng.choice([0.5, -2.5, 2.5])) if rng.random() < 0.3 else int(rng.integers(4))
    return int(rng.integers(-6, 7))


def _predicate(name: str, rng: np.random.Generator, table: pa.Table | None) -> list[Any]:
    op = str(rng.choice([*_OPS, "in", "not in"]))
    if op not in ("in", "not in"):
        return [name, op, _constant(name, rng, table)]
    size = int(rng.choice([0, 1, 3, 2000]))
    values = [_constant(name, rng, table) for _ in range(size)]
    if rng.random() < 0.5:
        values.append(None)
    return [name, op, values]


def _random_filter(rng: np.random.Generator, table: pa.Table | None) -> list[Any]:
    names = list(_TYPES)
    return [
        [_predicate(str(rng.choice(names)), rng, table) for _ in range(int(rng.integers(1, 4)))]
        for _ in range(int(rng.integers(1, 4)))
    ]


def _bits(buffer: pa.Buffer, offset: int, length: int) -> np.ndarray:
    unpacked = np.unpackbits(np.frombuffer(buffer, np.uint8), bitorder="little")
    return unpacked[offset : offset + length]


def _identical(got: pa.Table, want: pa.Table) -> bool:
    """The same schema, rows and bytes: each column's validity and every value's
    bytes (under a null too; NaN equals itself)."""
    if not got.schema.equals(want.schema, check_metadata=True) or got.num_rows != want.num_rows:
        return False
    for a, b in zip(got.columns, want.columns, strict=True):
        a, b = a.combine_chunks(), b.combine_chunks()
        if a.is_valid().to_pylist() != b.is_valid().to_pylist():
            return False
        if pa.types.is_boolean(a.type):
            same = np.array_equal(
                _bits(a.buffers()[1], a.offset, len(a)), _bits(b.buffers()[1], b.offset, len(b))
            )
        else:
            size = a.type.bit_width // 8
            raw = [
                np.frombuffer(x.buffers()[1], np.uint8)[
                    x.offset * size : (x.offset + len(x)) * size
                ]
                for x in (a, b)
            ]
            same = np.array_equal(raw[0], raw[1])
        if not same:
            return False
    return True


def _host() -> Any:
    return HostBackend(device_total_bytes=1 << 28).create_domain(0)


def _reference(frames: list[DeviceFrame], filters: list[Any], output: list[str]) -> pa.Table:
    """``filter_mask`` of each frame, then ``gather_table`` (the generic path)."""
    rows = []
    for frame, flt in zip(frames, filters, strict=True):
        if flt is None:
            rows.append(None)
            continue
        columns = {c.name: c for c in frame.columns if c.name in flt.columns}
        rows.append(np.flatnonzero(filter_mask(flt, columns, frame.num_rows, np)))
    return gather_table(frames, rows, output, _host(), staged=True)


def _run(
    frames: list[DeviceFrame],
    filters: list[Any],
    output: list[str],
    on_device: bool,
    chunk_rows: int = 64,
) -> tuple[Any, _fused_port.PortKernels, _fused_port.Domain]:
    kernels = _fused_port.PortKernels()
    domain = _fused_port.Domain()
    with domain.scope():
        got = _fused._fused_scan(frames, filters, output, domain, on_device, kernels, chunk_rows)
    return got, kernels, domain


def _frames(seed: int, sizes: list[int], nulls: bool) -> list[DeviceFrame]:
    rng = np.random.default_rng(seed)
    host = _host()
    return [DeviceFrame.from_arrow(_table(n, rng, nulls), domain=host) for n in sizes]


@pytest.mark.parametrize("nulls", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_random_filters_over_every_type_equal_filter_mask_and_gather_table(
    seed: int, nulls: bool
) -> None:
    rng = np.random.default_rng(seed)
    sizes = [int(rng.choice([0, 1, 63, 64, 65, 300])) for _ in range(int(rng.integers(1, 6)))]
    frames = _frames(seed, sizes, nulls)
    schema = frames[0].schema
    output = [str(n) for n in rng.choice(list(_TYPES), int(rng.integers(1, 5)), replace=False)]
    sample = frames[int(np.argmax(sizes))].to_arrow()
    for _ in range(6):
        flt = canonical_filter(_random_filter(rng, sample), schema)
        filters = [None if rng.random() < 0.15 else flt for _ in frames]
        want = _reference(frames, filters, output)
        got, _kernels, _ = _run(frames, filters, output, on_device=False)
        assert got is not None, flt.key if flt else None
        assert _identical(got, want), flt.key
        on_device, _, domain = _run(frames, filters, output, on_device=True)
        assert isinstance(on_device, DeviceFrame)
        assert on_device.domain is domain
        assert _identical(on_device.to_arrow(), want), flt.key
        counted = _fused._fused_count(frames, filters, domain, _fused_port.PortKernels(), 64)
        assert counted == want.num_rows


@pytest.mark.parametrize("name", list(_TYPES))
@pytest.mark.parametrize("op", [*_OPS, "in", "not in"])
@pytest.mark.parametrize("nulls", [False, True])
def test_every_op_on_every_type_equals_filter_mask(name: str, op: str, nulls: bool) -> None:
    rng = np.random.default_rng(abs(hash((name, op, nulls))) % 1000)
    frames = _frames(3, [200, 0, 150], nulls)
    sample = frames[0].to_arrow()
    for _ in range(5):
        if op in ("in", "not in"):
            size = int(rng.choice([0, 2, 5000]))
            value: Any = [_constant(name, rng, sample) for _ in range(size)]
            if rng.random() < 0.5:
                value.append(None)
        else:
            value = _constant(name, rng, sample)
        flt = canonical_filter([[name, op, value]], frames[0].schema)
        assert flt is not None
        filters = [flt] * len(frames)
        want = _reference(frames, filters, ["int64", name])
        got, _, _ = _run(frames, filters, ["int64", name], on_device=False, chunk_rows=32)
        assert got is not None
        assert _identical(got, want), flt.key


def test_every_row_kept_no_row_kept_and_many_objects() -> None:
    frames = _frames(5, [70] * 40 + [0, 1, 2048], nulls=True)
    schema = frames[0].schema
    keep_all = canonical_filter([("int8", ">=", -128)], schema)
    keep_none = canonical_filter([("int8", ">", 127)], schema)
    some = canonical_filter([[("uint64", ">", 2)], [("float32", "<", 0.5)]], schema)
    for filters in (
        [keep_all] * len(frames),
        [keep_none] * len(frames),
        [None] * len(frames),
        [keep_all, keep_none, some, None] * 10 + [some, keep_all, some],
    ):
        want = _reference(frames, filters, ["int64", "bool", "float32"])
        got, _kernels, _ = _run(frames, filters, ["int64", "bool", "float32"], on_device=False)
        assert got is not None
        assert _identical(got, want)


def test_one_upload_three_launches_and_one_wait_whatever_the_objects() -> None:
    for count in (1, 4, 64):
        frames = _frames(count, [100] * count, nulls=True)
        flt = canonical_filter(
            [("int64", ">", 0), ("float64", "<", 1.0), ("uint8", "in", [1, 2, None])],
            frames[0].schema,
        )
        uploads, reads = _fused_port.UPLOADS[0], _emulator.READS[0]
        got, kernels, _ = _run(frames, [flt] * count, ["int64", "float64"], on_device=True)
        assert got is not None
        assert dict(kernels.launches) == {name: 1 for name in FUSED_KERNELS}
        assert _fused_port.UPLOADS[0] - uploads == 1
        assert _emulator.READS[0] - reads == 1  # the kept rows' total: the one wait
        reads = _emulator.READS[0]
        domain = _fused_port.Domain()
        counting = _fused_port.PortKernels()
        with domain.scope():
            _fused._fused_count(frames, [flt] * count, domain, counting, 64)
        assert dict(counting.launches) == {"fused_filter_count": 1}
        assert _emulator.READS[0] - reads == 1


def test_filters_the_kernel_cannot_run_are_left_to_the_generic_path() -> None:
    host = _host()
    table = pa.table(
        {
            "i": pa.array([1, 2, 3], pa.int32()),
            "s": pa.array(["a", "b", "c"]),
            "d": pa.array(["x", "y", "x"]).dictionary_encode(),
            "h": pa.array(np.array([1, 2, 3], np.float16)),
        }
    )
    frames = [DeviceFrame.from_arrow(table, domain=host)]
    schema = table.schema
    for raw in ([("s", "=", "a")], [("d", "in", ["x"])], [("h", "<", 2.0)]):
        flt = canonical_filter(raw, schema)
        assert _run(frames, [flt], ["i"], on_device=False)[0] is None
        assert _fused._fused_count(frames, [flt], _fused_port.Domain(), None, 64) is None
    # a constant the file's narrower storage cannot hold: NumPy's answer, not the kernel's
    wide = canonical_filter([("i", "<", 1 << 40)], schema.set(0, pa.field("i", pa.int64())))
    assert _run(frames, [wide], ["i"], on_device=False)[0] is None
    # strings in the output, or more output columns than one gather writes
    flt = canonical_filter([("i", ">", 1)], schema)
    assert _run(frames, [flt], ["s"], on_device=False)[0] is None
    many = pa.table({f"c{i}": pa.array([i]) for i in range(MAX_OUTPUTS + 1)})
    frames = [DeviceFrame.from_arrow(many, domain=host)]
    flt = canonical_filter([("c0", "=", 0)], many.schema)
    assert _run(frames, [flt], many.column_names, on_device=False)[0] is None


class _Failing(_fused_port.PortKernels):
    def fused_gather(self, *args: Any) -> None:
        raise RuntimeError("the gather failed")


def test_a_failed_launch_releases_every_allocation() -> None:
    frames = _frames(9, [500, 300], nulls=True)
    flt = canonical_filter([("int64", ">", 0)], frames[0].schema)
    domain = _fused_port.Domain()
    with domain.scope(), pytest.raises(RuntimeError, match="gather failed") as failure:
        _fused._fused_scan(frames, [flt, flt], ["int64", "bool"], domain, True, _Failing(), 64)
    gc.collect()
    assert failure.value is not None  # the exception (and its traceback) still held
    assert domain.used_bytes() == 0


@pytest.mark.parametrize("name", FUSED_KERNELS)
def test_the_kernels_compile(name: str) -> None:
    pytest.importorskip("cuda.core")
    from nexus_cache._kernel_loader import compile_cubin

    cubin, _ = compile_cubin(FUSED_SOURCE, name, "sm_90")
    assert cubin
