"""One setting chosen from a short list, given directly or through an environment variable.

Both backend settings (``NEXUS_DEVICE_BACKEND``, ``NEXUS_DEVICE_ALLOCATOR``)
are read this way, so they accept the same spellings and fail with the same
kind of message. Pure function of its arguments and ``os.environ``: thread-safe.
"""

from __future__ import annotations

import os

from nexus_cache.errors import ConfigError

__all__ = ["choose"]


def choose(
    name: str | None, *, env: str, accepted: tuple[str, ...], what: str, argument: str
) -> str:
    """``name`` (None: ``$env``; unset or empty is ``auto``) checked against ``accepted``.

    Case and surrounding spaces are ignored. Raises :class:`ConfigError`
    naming where the value came from (``argument`` or ``env``), calling it
    ``what`` and listing ``accepted``.
    """
    source = argument
    if name is None:
        name = os.environ.get(env, "") or "auto"
        source = env
    choice = name.strip().lower() if isinstance(name, str) else name
    if choice not in accepted:
        raise ConfigError(f"{source}={name!r} is not {what}; accepted: {', '.join(accepted)}")
    return choice
