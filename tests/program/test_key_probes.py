"""Toolchain probes: fail closed but stable, and finer than major.minor."""

from __future__ import annotations

import multiprocessing
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from nexus_cache.program.keys import _libident, _probes, clear_probe_cache, make_program_cache_key

core = pytest.importorskip("cuda.core")

SRC = 'extern "C" __global__ void k(int *a) { *a = 1; }'
PTX = ".version 8.0\n.target sm_90\n.address_size 64\n"


def key(code: str = SRC, code_type: str = "c++", target: str = "cubin") -> bytes:
    return make_program_cache_key(
        code=code,
        code_type=code_type,
        options=core.ProgramOptions(arch="sm_90"),
        target_type=target,
    )


@pytest.fixture(autouse=True)
def _fresh_probes() -> Iterator[None]:
    clear_probe_cache()
    yield
    clear_probe_cache()


def fake_elf(build_id: bytes | None, size: int = 4096) -> bytes:
    """A minimal ELF64 file with one PT_NOTE segment holding a GNU build-id."""
    note = b""
    if build_id is not None:
        name = b"GNU\0"
        note = struct.pack("<III", len(name), len(build_id), 3) + name + build_id
        note += b"\0" * (-len(note) % 4)
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    ehdr = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 64, 0, 0, 64, 56, 1, 0, 0, 0)
    phdr = struct.pack("<IIQQQQQQ", 4, 4, 120, 0, 0, len(note), len(note), 4)
    body = ehdr + phdr + note
    return body + b"\0" * (size - len(body))


# -- library identity --------------------------------------------------------------


def test_gnu_build_id_is_read_from_the_note_segment(tmp_path: Path) -> None:
    lib = tmp_path / "libfake.so.1"
    lib.write_bytes(fake_elf(b"\xab" * 20))
    with open(lib, "rb") as f:
        assert _libident.gnu_build_id(f) == b"\xab" * 20
    assert _libident.file_identity(str(lib)) == f"libfake.so.1:4096:build-id={'ab' * 20}"


def test_identity_without_build_id_falls_back_to_content_digest(tmp_path: Path) -> None:
    a, b = tmp_path / "a.dll", tmp_path / "b.dll"
    a.write_bytes(b"MZ" + b"\0" * 5000)
    b.write_bytes(b"MZ" + b"\1" * 5000)
    ida, idb = _libident.file_identity(str(a)), _libident.file_identity(str(b))
    assert "head-tail-sha256=" in ida
    assert ida.split(":")[2] != idb.split(":")[2]


def test_identity_resolves_symlinks_to_the_versioned_file(tmp_path: Path) -> None:
    real = tmp_path / "libnvrtc.so.13.0.88"
    real.write_bytes(fake_elf(b"\x01" * 20))
    link = tmp_path / "libnvrtc.so.13"
    os.symlink(real.name, link)
    assert _libident.file_identity(str(link)).startswith("libnvrtc.so.13.0.88:")


def test_real_nvrtc_identity_names_the_exact_build() -> None:
    ident = _probes.nvrtc_identity().decode()
    assert ident.startswith("nvrtc=")
    assert "lib=libnvrtc" in ident
    assert "build-id=" in ident
    assert "builtins=" in ident  # the headers/intrinsics library beside it


def test_two_nvrtc_builds_of_one_major_minor_get_different_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Same file name, same size, same reported version: only the build differs.
    builds = {}
    for tag in ("a", "b"):
        d = tmp_path / tag
        d.mkdir()
        (d / "libnvrtc.so.13").write_bytes(fake_elf(tag.encode() * 20))
        builds[tag] = str(d / "libnvrtc.so.13")
    keys = []
    for tag in ("a", "b"):
        monkeypatch.setattr(_probes, "loaded_library_path", lambda *_a, t=tag: builds[t])
        clear_probe_cache()
        keys.append(key())
        assert f"build-id={(tag.encode() * 20).hex()}" in _probes.nvrtc_identity().decode()
    assert keys[0] != keys[1]


# -- fail closed, but stable ---------------------------------------------------------


def _boom(message: str):  # type: ignore[no-untyped-def]
    def probe() -> str:
        raise RuntimeError(message)

    return probe


def test_probe_failure_is_a_fixed_marker_and_a_stable_key(monkeypatch: pytest.MonkeyPatch) -> None:
    good = key()
    monkeypatch.setattr(_probes, "_nvrtc", _boom("first message 0x7f01"))
    clear_probe_cache()
    broken = key()
    assert _probes.nvrtc_identity() == b"nvrtc=probe-failed:RuntimeError"
    clear_probe_cache()
    monkeypatch.setattr(_probes, "_nvrtc", _boom("another message 0x7f99"))
    assert key() == broken  # the message never leaks into the key
    assert broken != good  # a broken toolchain never shares keys with a working one


def test_missing_library_file_is_a_stable_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_probes, "loaded_library_path", lambda *_a: None)
    first = _probes.nvrtc_identity()
    clear_probe_cache()
    assert _probes.nvrtc_identity() == first
    assert b"lib=lib-unknown" in first


def test_probes_are_isolated_per_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    cxx, ptx = key(), key(PTX, "ptx")
    clear_probe_cache()
    monkeypatch.setattr(_probes, "_linker", _boom("linker gone"))
    assert key() == cxx  # the linker's state never perturbs an NVRTC key
    assert key(PTX, "ptx") != ptx


def test_probe_results_ignore_warning_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    def noisy() -> str:
        warnings.warn("advisory", RuntimeWarning, stacklevel=1)
        return "1.0"

    monkeypatch.setattr(_probes, "_linker", noisy)
    clear_probe_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _probes.linker_identity() == b"linker=1.0"


def _key_in_child(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    queue.put(key())


def test_keys_agree_across_processes() -> None:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_key_in_child, args=(queue,))
    child.start()
    theirs = queue.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0
    assert theirs == key()
