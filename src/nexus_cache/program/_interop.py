"""Make our caches acceptable to ``cuda.core.Program.compile(cache=...)``.

cuda.core checks ``isinstance(cache, cuda.core.utils.ProgramCacheResource)``.
Registering our ABC as a *virtual subclass* of that class makes every
nexus-cache backend pass the check, with no import of cuda.core in ours.

Why an import hook rather than only an explicit call: registration needs
cuda.core's class, importing cuda.core costs about 0.3 s (too much for every
``import nexus_cache.program``, most of which never touch cuda.core), and
``Program.compile(cache=ours)`` must not depend on whether the user imported
cuda.core before or after nexus-cache. So :func:`activate` (run when
``nexus_cache.program`` is imported) registers at once if cuda.core's cache
module is already loaded; otherwise it installs a tiny import hook that
waits for that module, registers right after it executes, and removes
itself. Without cuda.core the hook never fires.

What the hook swallows: a failure while locating or registering (a
cuda.core layout this code does not know) must not break the user's
``import cuda.core``, so it is caught, logged as a WARNING with its
traceback on the ``nexus_cache.program`` logger, and costs interop only.
:func:`register_with_cuda_core` is the explicit, loud alternative: it
imports cuda.core and raises when registration is impossible.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

from nexus_cache.errors import BackendUnavailableError
from nexus_cache.program._resource import ProgramCacheResource

_log = logging.getLogger("nexus_cache.program")

__all__ = ["activate", "deactivate", "is_registered", "register_with_cuda_core"]

# Modules that define or re-export cuda.core's ProgramCacheResource, the
# defining one first (cuda.core 1.2 layout).
_WATCHED = (
    "cuda.core.utils._program_cache._abc",
    "cuda.core.utils._program_cache",
    "cuda.core.utils",
)

_lock = threading.Lock()


def _register_from(module: Any) -> bool:
    peer = getattr(module, "ProgramCacheResource", None)
    register = getattr(peer, "register", None)
    if peer is None or register is None:
        return False
    if not issubclass(ProgramCacheResource, peer):
        register(ProgramCacheResource)
    return True


def _register_from_loaded() -> bool:
    for name in _WATCHED:
        module = sys.modules.get(name)
        if module is not None:
            try:
                if _register_from(module):
                    return True
            except Exception:
                _log.warning(
                    "could not register nexus-cache resources with %s; "
                    "Program.compile(cache=...) will refuse them",
                    name,
                    exc_info=True,
                )
                return False
    return False


def is_registered() -> bool:
    """Whether cuda.core is loaded and accepts our caches as its resources."""
    module = sys.modules.get("cuda.core.utils")
    peer = getattr(module, "ProgramCacheResource", None)
    try:
        return peer is not None and issubclass(ProgramCacheResource, peer)
    except Exception:
        _log.warning("could not ask cuda.core about registration", exc_info=True)
        return False


def register_with_cuda_core() -> bool:
    """Import cuda.core now and register our caches with it; returns ``True``.

    Raises :class:`~nexus_cache.errors.BackendUnavailableError` (an
    ``ImportError``) when cuda.core cannot be imported or has no
    ``cuda.core.utils.ProgramCacheResource`` to register with.
    """
    try:
        import cuda.core.utils
    except Exception as exc:
        raise BackendUnavailableError(
            f"cannot register with cuda.core: importing cuda.core.utils failed ({exc!r}); "
            "install it with pip install 'nexus-cache[cuda]'"
        ) from exc
    if not _register_from(cuda.core.utils):
        raise BackendUnavailableError(
            "cannot register with cuda.core: cuda.core.utils has no ProgramCacheResource "
            f"(cuda.core {getattr(sys.modules.get('cuda.core'), '__version__', '?')}); "
            "nexus-cache needs cuda.core >= 1.2"
        )
    deactivate()
    return True


class _RegisteringLoader:
    """Runs the real loader, then registers; otherwise the real loader."""

    def __init__(self, inner: Any, hook: _ImportHook) -> None:
        self._inner = inner
        self._hook = hook

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        # Put the real loader back first, so the module never sees this shim.
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._inner
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._inner
        self._inner.exec_module(module)
        self._hook.loaded(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _ImportHook:
    """A meta path finder that only ever wraps the loaders of ``_WATCHED``."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _WATCHED:
            return None
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is not None:
                    spec = find(fullname, path, target)
                    if spec is not None:
                        break
            if spec is None or not hasattr(spec.loader, "exec_module"):
                return spec
            spec.loader = _RegisteringLoader(spec.loader, self)
            return spec
        except Exception:
            _log.warning(
                "nexus-cache's import hook failed on %s; importing it untouched "
                "(Program.compile(cache=...) may refuse nexus-cache resources)",
                fullname,
                exc_info=True,
            )
            return None  # let the regular machinery import it untouched

    def loaded(self, module: Any) -> None:
        try:
            if _register_from(module):
                deactivate()
        except Exception:
            _log.warning(
                "could not register nexus-cache resources with %s; "
                "Program.compile(cache=...) will refuse them (call "
                "nexus_cache.program.register_with_cuda_core() to see why)",
                getattr(module, "__name__", module),
                exc_info=True,
            )


def activate() -> None:
    """Register now if cuda.core is loaded, else wait for it (idempotent)."""
    with _lock:
        if _register_from_loaded():
            return
        if not any(isinstance(f, _ImportHook) for f in sys.meta_path):
            sys.meta_path.insert(0, _ImportHook())


def deactivate() -> None:
    """Remove the import hook (registration, once done, stays)."""
    with _lock:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _ImportHook)]
