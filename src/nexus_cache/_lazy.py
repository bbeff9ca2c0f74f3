"""Lazy public names for package ``__init__`` modules (PEP 562 ``__getattr__``).

A package lists ``name -> module`` and gets the module-level ``__getattr__``
and ``__dir__`` from :func:`lazy_exports`: a name's home module is imported on
its first access only, so importing the package stays cheap. Imports only the
standard library. Thread-safe as far as ``importlib`` is (the first access of
a name may import its module from two threads; both get the same object).
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing is not imported: see nexus_cache/__init__.py
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose lazy names are ``exports``.

    ``exports`` maps each public name to the absolute name of the module that
    defines it; ``namespace`` is the package's ``globals()``, where a loaded
    name is cached so later accesses skip ``__getattr__``. ``__dir__`` lists
    the namespace and ``__all__``.
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
