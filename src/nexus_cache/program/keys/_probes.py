"""Toolchain identity probes: which compiler, linker and front end made a binary.

Every probe returns text that goes into the key. Probes *fail closed but
stable*: when a library is missing or a call fails, the probe returns a fixed
marker naming the label and the exception class (never its message, which
may embed addresses or paths), so

* a broken environment never shares keys with a working one, and
* two processes that fail the same way still agree on their keys.

Results are computed once per process (the loaded libraries cannot change
under a running process) and shared by all threads.
"""

from __future__ import annotations

import glob
import os
import sys
import threading
import warnings
from collections.abc import Callable
from typing import SupportsInt

from nexus_cache.program.keys._libident import file_identity, loaded_library_path

__all__ = [
    "clear_probe_cache",
    "frontend_identity",
    "generation",
    "linker_identity",
    "nvrtc_identity",
    "nvvm_identity",
    "probe",
]

_lock = threading.Lock()
_results: dict[str, bytes] = {}
_generation = 0  # bumped by clear_probe_cache, so memoized keys can tell


def probe(label: str, fn: Callable[[], str]) -> bytes:
    """``b"<label>=<fn()>"``, or ``b"<label>=probe-failed:<ExceptionClass>"``.

    Cached per label for the life of the process; see :func:`clear_probe_cache`.
    """
    cached = _results.get(label)
    if cached is not None:
        return cached
    try:
        # Probes must not depend on the caller's warning filters: under
        # ``-W error`` a library's advisory warning would otherwise turn
        # into a probe failure and change the key.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            text = fn()
        value = f"{label}={text}".encode()
    except Exception as exc:
        value = f"{label}=probe-failed:{type(exc).__name__}".encode()
    with _lock:
        return _results.setdefault(label, value)


def clear_probe_cache() -> None:
    """Forget cached probe results (tests; after swapping libraries in-process)."""
    global _generation
    with _lock:
        _results.clear()
        _generation += 1


def generation() -> int:
    """Changes whenever cached probe results are dropped."""
    return _generation


def _library(soname_prefix: str, pathfinder_name: str | None) -> tuple[str, str | None]:
    path = loaded_library_path(soname_prefix, pathfinder_name)
    if path is None:
        return "lib-unknown", None
    try:
        return file_identity(path), path
    except OSError as exc:
        return f"lib-unreadable:{type(exc).__name__}", path


def _status_ok(status: SupportsInt) -> bool:
    return int(getattr(status, "value", status)) == 0


def _nvrtc() -> str:
    from cuda.bindings import nvrtc

    status, major, minor = nvrtc.nvrtcVersion()
    if not _status_ok(status):
        raise RuntimeError(f"nvrtcVersion failed: {status}")
    lib, path = _library("libnvrtc.so", "nvrtc")
    parts = [f"{major}.{minor}", f"lib={lib}"]
    if path is not None:
        # NVRTC dlopens its builtins library (the built-in headers and
        # intrinsics) only when it first compiles, so it is found next to
        # libnvrtc rather than in the loaded-library list.
        seen = set()
        pattern = os.path.join(os.path.dirname(os.path.realpath(path)), "*nvrtc-builtins*")
        for candidate in sorted(glob.glob(pattern)):
            real = os.path.realpath(candidate)
            if real in seen or not (".so" in real or real.endswith(".dll")):
                continue
            seen.add(real)
            try:
                parts.append(f"builtins={file_identity(real)}")
            except OSError as exc:
                parts.append(f"builtins=unreadable:{type(exc).__name__}")
    return ";".join(parts)


def nvrtc_identity() -> bytes:
    """NVRTC ``major.minor`` plus the exact libnvrtc and builtins builds."""
    return probe("nvrtc", _nvrtc)


def _uses_driver_linker() -> bool:
    try:
        from cuda.core._linker import _decide_nvjitlink_or_driver
    except ImportError:
        # Same preference cuda.core applies: nvJitLink when it loads.
        try:
            from cuda.bindings import nvjitlink

            nvjitlink.version()
        except Exception:
            return True
        return False
    return bool(_decide_nvjitlink_or_driver())


def _linker() -> str:
    if _uses_driver_linker():
        from cuda.bindings import driver

        status, version = driver.cuDriverGetVersion()
        if not _status_ok(status):
            raise RuntimeError(f"cuDriverGetVersion failed: {status}")
        lib, _ = _library("libcuda.so", None)
        return f"driver:{version};lib={lib}"
    from cuda.bindings import nvjitlink

    major, minor = nvjitlink.version()
    lib, _ = _library("libnvJitLink.so", "nvJitLink")
    return f"nvjitlink:{major}.{minor};lib={lib}"


def linker_identity() -> bytes:
    """The linker PTX goes through (nvJitLink or the driver), its version and build."""
    return probe("linker", _linker)


def _nvvm() -> str:
    from cuda.bindings import nvvm

    major, minor = nvvm.version()
    ir = ".".join(str(v) for v in nvvm.ir_version())
    lib, _ = _library("libnvvm.so", "nvvm")
    return f"{major}.{minor};ir={ir};lib={lib}"


def nvvm_identity() -> bytes:
    """libNVVM version, IR version and exact build."""
    return probe("nvvm", _nvvm)


def _frontend() -> str:
    module = sys.modules.get("cuda.core")
    version = getattr(module, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("cuda-core")
    return str(version)


def frontend_identity() -> bytes:
    """The ``cuda.core`` version: it turns ``ProgramOptions`` into compiler flags."""
    return probe("cuda.core", _frontend)
