"""One setting chosen from a short list, given directly or through an environment variable.

Both backend settings (``NEXUS_DEVICE_BACKEND``, ``NEXUS_DEVICE_ALLOCATOR``)
are read this way, so they accept the same spellings and fail with the same
kind of message. Pure function of its arguments and the environment: thread-safe.
"""

from __future__ import annotations

from nexus_cache._env import Variable, parse_choice, read

__all__ = ["choose"]


def choose(name: str | None, *, variable: Variable, argument: str) -> str:
    """``name`` (None: ``variable``'s value, unset or blank is its default) checked
    against ``variable.choices``.

    Case and surrounding spaces are ignored. Raises :class:`ConfigError`
    naming where the value came from (``argument`` or the variable) and
    listing the accepted values.
    """
    if name is None:
        return str(read(variable))
    return parse_choice(name, argument, variable.choices)
