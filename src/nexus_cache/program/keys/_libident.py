"""Identity of a loaded shared library, finer than its reported version.

Two NVRTC builds can report the same ``major.minor`` (a patch release, a
hot-fix wheel, a distro rebuild) yet emit different code. The key therefore
names the exact build: the library's GNU build-id (a hash the linker stamps
into every ELF build) when present, else a SHA-256 over the file's first and
last 64 KiB. Both are cheap (a few small reads) and stable across machines
that install the same build, unlike mtimes or inode numbers.
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
from typing import BinaryIO

__all__ = ["file_identity", "gnu_build_id", "loaded_library_path"]

_PT_NOTE = 4
_NT_GNU_BUILD_ID = 3
_HEAD_TAIL = 64 * 1024
_MAX_NOTE_BYTES = 64 * 1024


def _align(n: int, to: int) -> int:
    return (n + to - 1) & ~(to - 1)


def _build_id_in_notes(notes: bytes, endian: str, align: int) -> bytes | None:
    pos = 0
    while pos + 12 <= len(notes):
        namesz, descsz, ntype = struct.unpack_from(endian + "III", notes, pos)
        pos += 12
        name = notes[pos : pos + namesz]
        pos += _align(namesz, align)
        desc = notes[pos : pos + descsz]
        pos += _align(descsz, align)
        if ntype == _NT_GNU_BUILD_ID and name.rstrip(b"\0") == b"GNU" and desc:
            return desc
    return None


def gnu_build_id(f: BinaryIO) -> bytes | None:
    """Return the ELF GNU build-id of an open file, or ``None`` if it has none.

    Reads only the ELF header, the program headers and the PT_NOTE segments.
    A file that is not ELF (a Windows DLL, a truncated file) yields ``None``.
    """
    head = f.read(64)
    if len(head) < 52 or head[:4] != b"\x7fELF":
        return None
    elf_class, data = head[4], head[5]
    endian = {1: "<", 2: ">"}.get(data)
    if endian is None or elf_class not in (1, 2):
        return None
    if elf_class == 2:
        (phoff,) = struct.unpack_from(endian + "Q", head, 0x20)
        phentsize, phnum = struct.unpack_from(endian + "HH", head, 0x36)
    else:
        (phoff,) = struct.unpack_from(endian + "I", head, 0x1C)
        phentsize, phnum = struct.unpack_from(endian + "HH", head, 0x2A)
    if phnum == 0 or phentsize == 0:
        return None
    f.seek(phoff)
    table = f.read(phentsize * phnum)
    for i in range(min(phnum, len(table) // phentsize)):
        base = i * phentsize
        (p_type,) = struct.unpack_from(endian + "I", table, base)
        if p_type != _PT_NOTE:
            continue
        if elf_class == 2:
            (offset,) = struct.unpack_from(endian + "Q", table, base + 8)
            (size,) = struct.unpack_from(endian + "Q", table, base + 32)
            (p_align,) = struct.unpack_from(endian + "Q", table, base + 48)
        else:
            (offset,) = struct.unpack_from(endian + "I", table, base + 4)
            (size,) = struct.unpack_from(endian + "I", table, base + 16)
            (p_align,) = struct.unpack_from(endian + "I", table, base + 28)
        f.seek(offset)
        notes = f.read(min(size, _MAX_NOTE_BYTES))
        found = _build_id_in_notes(notes, endian, 8 if p_align == 8 else 4)
        if found is not None:
            return found
    return None


def file_identity(path: str) -> str:
    """``"<basename>:<size>:<build-id or head/tail digest>"`` of the file ``path`` names.

    Symlinks are resolved first, so ``libnvrtc.so.13`` pointing at
    ``libnvrtc.so.13.0.88`` reports the versioned name. Raises ``OSError``
    when the file cannot be read.
    """
    real = os.path.realpath(path)
    with open(real, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        build_id = gnu_build_id(f)
        if build_id is not None:
            return f"{os.path.basename(real)}:{size}:build-id={build_id.hex()}"
        h = hashlib.sha256()
        f.seek(0)
        h.update(f.read(_HEAD_TAIL))
        if size > _HEAD_TAIL:
            f.seek(max(_HEAD_TAIL, size - _HEAD_TAIL))
            h.update(f.read(_HEAD_TAIL))
        return f"{os.path.basename(real)}:{size}:head-tail-sha256={h.hexdigest()}"


def _mapped_paths() -> list[str]:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    paths = []
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/"):
            paths.append(fields[5])
    return paths


def loaded_library_path(soname_prefix: str, pathfinder_name: str | None = None) -> str | None:
    """Path of the shared library this process has loaded, or ``None``.

    ``soname_prefix`` is the file-name prefix up to and including ``.so``
    (``"libnvrtc.so"``); on Linux the answer comes from ``/proc/self/maps``,
    which names exactly the file the loader mapped. Elsewhere, or when the
    maps file is unreadable, ``cuda.pathfinder`` is asked for the library it
    loads under ``pathfinder_name``.
    """
    if sys.platform.startswith("linux"):
        for path in _mapped_paths():
            if os.path.basename(path).startswith(soname_prefix):
                return path
    if pathfinder_name is not None:
        try:
            from cuda.pathfinder import load_nvidia_dynamic_lib

            found = load_nvidia_dynamic_lib(pathfinder_name).abs_path
        except Exception:
            return None
        return str(found) if found else None
    return None
