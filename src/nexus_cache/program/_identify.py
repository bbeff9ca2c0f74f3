"""What a path holds, said without creating or changing anything.

:func:`identify_cache_path` answers one of :data:`CACHE_KINDS`: a program
cache of ours (file stream or SQLite), cuda.core's own file-stream cache, a
lakehouse cache root, an empty directory, a symbolic link, or something else.
The caches call it before they open a directory (a program cache refuses a
lakehouse root and cuda.core's layout); the CLI calls it to name what a path
is. It only reads: safe beside any number of threads and processes.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

__all__ = ["CACHE_KINDS", "identify_cache_path"]

#: what :func:`identify_cache_path` can answer
CACHE_KINDS = (
    "missing",
    "filestream",
    "sqlite",
    "cuda-core-filestream",
    "lakehouse",
    "empty-dir",
    "symlink",
    "other",
)

_SQLITE_MAGIC = b"SQLite format 3\x00"
_OURS_RE = re.compile(r"[0-9a-f]{64}\Z")
_CUDA_CORE_RE = re.compile(r"[0-9a-f]{62}\Z")  # cuda.core drops the 2 hex of the subdir


def identify_cache_path(path: str | os.PathLike[str]) -> str:
    """What ``path`` holds, as one of :data:`CACHE_KINDS`; reads only.

    ``lakehouse`` is a lakehouse cache root (it has a ``layout.json``).
    ``cuda-core-filestream`` is cuda.core's own ``FileStreamProgramCache``
    directory (its entry files are named by 62 hex digits under a 2-digit
    subdirectory; ours by all 64).
    """
    p = Path(path).expanduser()
    try:
        st = os.lstat(p)
    except (FileNotFoundError, NotADirectoryError):  # no such path (nor can there be)
        return "missing"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"  # the caches refuse symlinked roots; let them say so
    if stat.S_ISREG(st.st_mode):
        try:
            with open(p, "rb") as f:
                head = f.read(len(_SQLITE_MAGIC))
        except OSError:
            return "other"
        return "sqlite" if head == _SQLITE_MAGIC else "other"
    if not stat.S_ISDIR(st.st_mode):
        return "other"
    try:
        names = set(os.listdir(p))
    except OSError:
        return "other"
    if not names:
        return "empty-dir"
    if "layout.json" in names:
        # a lakehouse cache root: its entries/ would pass for ours, and a
        # verify would remove every one of them as corrupt
        return "lakehouse"
    if "entries" not in names:
        return "other"
    found = _first_entry_name(p / "entries")
    if found is not None and _CUDA_CORE_RE.match(found):
        return "cuda-core-filestream"
    return "filestream"


def _first_entry_name(entries: Path) -> str | None:
    try:
        subdirs = sorted(os.listdir(entries))
    except OSError:
        return None
    for sub in subdirs:
        try:
            for name in os.listdir(entries / sub):
                if _OURS_RE.match(name) or _CUDA_CORE_RE.match(name):
                    return name
        except OSError:
            continue
    return None
