"""The PTX loadability warning, re-emitted on cache hits.

``cuda.core`` warns (``RuntimeWarning``) when NVRTC compiles C++ to PTX and
the installed driver is older than NVRTC: the driver JIT cannot load PTX of
a newer ISA. Whether PTX loads depends on the driver, not on whether the
bytes were compiled just now, so a cache hit warns under exactly the same
condition: ``code_type == "c++"``, ``target_type == "ptx"`` and
``nvrtc_major * 1000 + nvrtc_minor * 10 > driver_version``.

Where the driver cannot be queried at all (no driver installed) nothing is
emitted on a hit: no PTX loads there, and the uncached compile fails outright
rather than warning, so there is no warning to reproduce.
"""

from __future__ import annotations

import warnings

__all__ = ["driver_version", "nvrtc_version", "ptx_loadable", "warn_if_unloadable"]


def driver_version() -> int:
    """``cuDriverGetVersion()`` (e.g. 12080); raises when no driver is available."""
    from cuda.bindings import driver

    status, version = driver.cuDriverGetVersion()
    if int(getattr(status, "value", status)) != 0:
        raise RuntimeError(f"cuDriverGetVersion failed: {status}")
    return int(version)


def nvrtc_version() -> tuple[int, int]:
    """``nvrtcVersion()`` as ``(major, minor)``."""
    from cuda.bindings import nvrtc

    status, major, minor = nvrtc.nvrtcVersion()
    if int(getattr(status, "value", status)) != 0:
        raise RuntimeError(f"nvrtcVersion failed: {status}")
    return int(major), int(minor)


def ptx_loadable() -> bool | None:
    """Whether the driver can load PTX this NVRTC emits; ``None`` if unknowable."""
    try:
        major, minor = nvrtc_version()
        return major * 1000 + minor * 10 <= driver_version()
    except Exception:
        return None


def warn_if_unloadable(code_type: str, target_type: str, *, stacklevel: int = 1) -> None:
    """Warn as the uncached compile would; ``stacklevel`` counts from the caller."""
    if code_type != "c++" or target_type != "ptx":
        return
    if ptx_loadable() is False:
        major, minor = nvrtc_version()
        warnings.warn(
            f"the installed CUDA driver ({driver_version()}) is older than NVRTC "
            f"{major}.{minor}, so it cannot load this PTX; upgrade the driver or "
            "compile to 'cubin'",
            RuntimeWarning,
            stacklevel=stacklevel + 1,
        )
