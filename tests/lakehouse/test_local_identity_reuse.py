"""A local file's identity: its real path and stat come from one opened object (as
``os.path.realpath`` then ``stat`` give them, links resolved), and a repeated plan of
an unchanged file takes the identity made before, while a rewritten or replaced
file, or one reached through another link, gets its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nexus_cache.lakehouse.identity import _identity
from nexus_cache.lakehouse.identity._identity import resolve_identity


def _aged(path: Path, seconds: float = 60.0) -> None:
    mtime_ns = path.stat().st_mtime_ns - int(seconds * 1e9)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def _file(path: Path, data: bytes = b"0123456789") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    _aged(path)
    return path


@pytest.fixture(params=["o_path", "realpath"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs with the ``O_PATH`` resolution and with the fallback."""
    if request.param == "realpath":
        monkeypatch.setattr(_identity, "_PATH_ONLY", None, raising=False)
    return str(request.param)


def test_links_resolve_as_realpath_resolves_them(tmp_path: Path, way: str) -> None:
    target = _file(tmp_path / "data" / "sub" / "t.parquet")
    (tmp_path / "linked_dir").symlink_to(tmp_path / "data")
    (tmp_path / "linked_file.parquet").symlink_to(target)
    spellings = [
        str(target),
        str(tmp_path / "linked_dir" / "sub" / "t.parquet"),
        str(tmp_path / "linked_file.parquet"),
        str(tmp_path / "linked_dir" / "sub" / ".." / "sub" / "t.parquet"),
    ]
    for spelling in spellings:
        identity = resolve_identity(None, spelling).identity
        assert identity is not None
        assert identity.location == f"file://{os.path.realpath(spelling)}"
        assert identity.content.inode == target.stat().st_ino
        assert identity.content.size == 10
    keys = {resolve_identity(None, s).identity.key for s in spellings}  # type: ignore[union-attr]
    assert len(keys) == 1


def test_a_repeated_plan_of_an_unchanged_file_takes_the_identity_made_before(
    tmp_path: Path, way: str
) -> None:
    path = _file(tmp_path / "t.parquet")
    first = resolve_identity(None, str(path)).identity
    again = resolve_identity(None, str(path)).identity
    assert first is not None
    assert again is first


@pytest.mark.parametrize("change", ["size", "mtime", "replaced"])
def test_a_changed_file_gets_another_identity(tmp_path: Path, way: str, change: str) -> None:
    path = _file(tmp_path / "t.parquet")
    first = resolve_identity(None, str(path)).identity
    assert first is not None
    if change == "size":
        _file(path, b"0123456789A")
    elif change == "mtime":
        _aged(path, 30)
    else:  # another file renamed over it: same size and mtime, another inode
        other = _file(tmp_path / "other.parquet")
        os.utime(other, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
        os.replace(other, path)
    again = resolve_identity(None, str(path)).identity
    assert again is not None
    assert again.key != first.key


def test_a_directory_and_a_missing_file_are_refused(tmp_path: Path, way: str) -> None:
    with pytest.raises(IsADirectoryError):
        resolve_identity(None, str(tmp_path))
    with pytest.raises(FileNotFoundError):
        resolve_identity(None, str(tmp_path / "missing.parquet"))
    (tmp_path / "dangling.parquet").symlink_to(tmp_path / "gone.parquet")
    with pytest.raises(FileNotFoundError):
        resolve_identity(None, str(tmp_path / "dangling.parquet"))
