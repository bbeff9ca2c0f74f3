"""The warning of a public module path that moved into a sub-package.

The old module re-exports the new one's public names and calls
:func:`warn_moved` once, when it is first imported (Python imports a module
once per process).
"""

from __future__ import annotations

import warnings

__all__ = ["warn_moved"]


def warn_moved(old: str, new: str) -> None:
    """A ``DeprecationWarning``: module ``old`` is now ``new``."""
    warnings.warn(
        f"{old} is deprecated; import from {new} or from nexus_cache.device "
        "(the same names, moved)",
        DeprecationWarning,
        stacklevel=3,
    )
