"""Delta tables read by ``read_table`` equal ``deltalake``'s own reader at every
version; deletion vectors and column mapping are refused by name; a corrupt or
truncated log is a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from nexus_cache.errors import ConfigError, SourceFormatError
from nexus_cache.tables import read_table, read_table_with_plan, resolve_table

from ._compare import assert_same_rows

deltalake = pytest.importorskip("deltalake")


def _batch(start: int, n: int) -> pa.Table:
    return pa.table(
        {
            "k": pa.array([i % 3 for i in range(start, start + n)], pa.int32()),
            "s": pa.array([None if i % 5 == 0 else f"r{i % 4}" for i in range(start, start + n)]),
            "v": pa.array([float(i) for i in range(start, start + n)]),
        }
    )


@pytest.fixture(scope="module")
def delta(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """version 0: write; 1: append; 2: delete; 3: overwrite of one partition; 4: append."""
    root = tmp_path_factory.mktemp("delta") / "t"
    deltalake.write_deltalake(str(root), _batch(0, 40), partition_by=["k", "s"])
    deltalake.write_deltalake(str(root), _batch(40, 40), mode="append", partition_by=["k", "s"])
    deltalake.DeltaTable(str(root)).delete("v > 60")
    deltalake.write_deltalake(
        str(root),
        _batch(100, 9).filter(pa.compute.equal(pa.compute.field("k"), 1)),
        mode="overwrite",
        partition_by=["k", "s"],
        predicate="k = 1",
    )
    deltalake.write_deltalake(str(root), _batch(200, 10), mode="append", partition_by=["k", "s"])
    return root


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4, None])
def test_every_version_equals_deltalake(delta: Path, version: int | None) -> None:
    snap = resolve_table(str(delta), as_of=version)
    assert snap.kind == "delta"
    assert snap.version == (4 if version is None else version)
    want = deltalake.DeltaTable(str(delta), version=version).to_pyarrow_table()
    assert_same_rows(read_table(snap), want.select(snap.schema.names))


@pytest.mark.parametrize(
    "flt",
    [
        [("k", "=", 1)],
        [("s", "in", ["r1", None])],
        [("k", "!=", 0), ("v", ">=", 30.0)],
        [[("s", "=", "r2")], [("v", "<", 5)]],
        [("k", "=", 7)],
    ],
    ids=str,
)
def test_filters_equal_deltalake_with_pruning(delta: Path, flt: list) -> None:
    import pyarrow.parquet as pq

    snap = resolve_table(str(delta))
    got, plan = read_table_with_plan(snap, filter=flt)
    want = deltalake.DeltaTable(str(delta)).to_pyarrow_table()
    want = want.select(snap.schema.names).filter(pq.filters_to_expression(flt))
    assert_same_rows(got, want)
    if flt == [("k", "=", 7)]:
        assert plan.pruned_by_partition == plan.objects_planned > 0
        assert got.num_rows == 0


def test_file_statistics_prune(delta: Path) -> None:
    snap = resolve_table(str(delta))
    assert all(f.row_count is not None for f in snap.files)
    _, plan = read_table_with_plan(snap, filter=[("v", ">", 1000.0)])
    assert plan.pruned_by_statistics == len(snap.files)
    assert plan.files == ()


def test_a_missing_version_names_as_of(delta: Path) -> None:
    with pytest.raises(ConfigError, match="as_of=99"):
        resolve_table(str(delta), as_of=99)


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _commit(root: Path, version: int, actions: list[dict]) -> None:
    path = root / "_delta_log" / f"{version:020d}.json"
    path.write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def test_deletion_vectors_are_refused_by_name(tmp_path: Path) -> None:
    root = tmp_path / "dv"
    deltalake.write_deltalake(str(root), pa.table({"v": [1, 2, 3]}))
    add = pa.table(deltalake.DeltaTable(str(root)).get_add_actions(flatten=False)).to_pylist()[0]
    dv = {
        "storageType": "u",
        "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
        "offset": 1,
        "sizeInBytes": 36,
        "cardinality": 1,
    }
    _commit(
        root,
        1,
        [
            {
                "protocol": {
                    "minReaderVersion": 3,
                    "minWriterVersion": 7,
                    "readerFeatures": ["deletionVectors"],
                    "writerFeatures": ["deletionVectors"],
                }
            },
            {"remove": {"path": add["path"], "deletionTimestamp": 1, "dataChange": True}},
            {
                "add": {
                    "path": add["path"],
                    "partitionValues": {},
                    "size": add["size_bytes"],
                    "modificationTime": 1,
                    "dataChange": True,
                    "deletionVector": dv,
                }
            },
        ],
    )
    with pytest.raises(SourceFormatError, match="deletionVectors"):
        resolve_table(str(root))
    assert resolve_table(str(root), as_of=0).files  # the version before them reads


def test_column_mapping_is_refused_by_name(tmp_path: Path) -> None:
    root = tmp_path / "cm"
    deltalake.write_deltalake(str(root), pa.table({"v": [1, 2, 3]}))
    meta = deltalake.DeltaTable(str(root)).metadata()
    schema = json.loads((root / "_delta_log" / f"{0:020d}.json").read_text().splitlines()[2])
    schema["metaData"]["configuration"] = {"delta.columnMapping.mode": "name"}
    _commit(
        root,
        1,
        [
            {"protocol": {"minReaderVersion": 2, "minWriterVersion": 5}},
            schema,
        ],
    )
    assert meta.id
    with pytest.raises(SourceFormatError, match="columnMapping"):
        resolve_table(str(root))


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "missing"])
def test_a_damaged_log_is_a_clear_error(delta: Path, tmp_path: Path, damage: str) -> None:
    root = _copy(delta, tmp_path / "t")
    first = root / "_delta_log" / f"{0:020d}.json"
    if damage == "corrupt":
        first.write_bytes(b"\x00\xff not json {{{\n")
    elif damage == "truncated":
        first.write_bytes(first.read_bytes()[: len(first.read_bytes()) // 2])
    else:
        for log in (root / "_delta_log").glob("*.json"):
            log.unlink()
    with pytest.raises((SourceFormatError, ConfigError)) as raised:
        resolve_table(str(root), as_of=0)
    assert "_delta_log" in str(raised.value) or "as_of" in str(raised.value)
    assert str(root) in str(raised.value) or "Delta table" in str(raised.value)
    # one line: not the native backtrace deltalake appends to its message
    assert "\n" not in str(raised.value)
    with pytest.raises((SourceFormatError, ConfigError)) as latest:
        resolve_table(str(root))
    assert "\n" not in str(latest.value)


@pytest.mark.parametrize("how", ["absolute"])
def test_a_log_pointing_outside_the_table_is_visible(
    delta: Path, tmp_path: Path, how: str
) -> None:
    import pyarrow.parquet as pq

    root = _copy(delta, tmp_path / "t")
    outside = tmp_path / "elsewhere.parquet"
    pq.write_table(pa.table({"k": pa.array([1], pa.int32()), "s": ["x"], "v": [1.0]}), outside)
    named = outside.as_uri() if how == "absolute" else "../elsewhere.parquet"
    _commit(
        root,
        5,
        [
            {
                "add": {
                    "path": named,
                    "partitionValues": {"k": "1", "s": "x"},
                    "size": outside.stat().st_size,
                    "modificationTime": 1,
                    "dataChange": True,
                }
            }
        ],
    )
    snap = resolve_table(str(root))
    assert snap.version == 5
    (found,) = snap.files_outside()
    assert Path(found).resolve() == outside
    assert found in snap.locations
    assert len(snap.files) == len(resolve_table(str(delta)).files) + 1
