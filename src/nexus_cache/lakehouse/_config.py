"""Configuration of the lakehouse byte cache.

:class:`LakehouseCacheConfig` is an immutable value; :meth:`LakehouseCacheConfig.from_env`
reads exactly these variables (an empty value counts as unset):

``NEXUS_LAKEHOUSE_CACHE_ROOT``
    Directory of the cache. Unset: no cache, every read is remote.
``NEXUS_LAKEHOUSE_CACHE_READ``
    ``enabled`` (default) or ``disabled``: may an existing entry serve a read?
``NEXUS_LAKEHOUSE_CACHE_POLICY``
    ``disabled`` (default), ``read_through`` or ``fill_before_read``: what a miss does.
``NEXUS_LAKEHOUSE_CACHE_MAX_BYTES``
    Best-effort LRU target of the entries' bytes; required with a filling policy.
``NEXUS_LAKEHOUSE_FILL_MAX_CONCURRENCY``
    Fills in flight at once in this service (default 4).
``NEXUS_LAKEHOUSE_FILL_MAX_HOST_BYTES``
    Object bytes in flight through fills at once in this service (default 2GiB).
``NEXUS_LAKEHOUSE_CACHE_BYPASS_BYTES``
    Objects larger than this are never cached (default: no threshold).
``NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S``
    Seconds the interpreter waits at exit for queued and running background
    fills to publish (default 30; ``0``: do not wait).
``NEXUS_LAKEHOUSE_LOG_READS``
    ``1``/``true``/``yes``/``on``: log every read's status, read mode and fill
    mode at INFO on the ``nexus_cache.lakehouse`` logger (default off).
``NEXUS_LAKEHOUSE_CACHE_IDENTITY_TTL``
    Seconds a proven remote identity is trusted without proving it again
    (default 0: every open proves it). Opt-in staleness: within the window a
    replaced object is served from its old entry.

Byte sizes use the package's one grammar (:mod:`nexus_cache._sizes`): plain bytes,
``64M``/``10G``/``10GiB`` (powers of 1024) or ``500MB``/``10GB`` (powers of 1000).
Seconds are finite numbers ``>= 0``. Every refused value raises
:class:`~nexus_cache.errors.ConfigError` naming the setting; a configuration with
several bad values names all of them in one error.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nexus_cache._numbers import parse_float_text, parse_int_text
from nexus_cache._sizes import parse_size
from nexus_cache.errors import ConfigError

__all__ = [
    "ENV_BYPASS_BYTES",
    "ENV_FILL_EXIT_WAIT_S",
    "ENV_FILL_MAX_CONCURRENCY",
    "ENV_FILL_MAX_HOST_BYTES",
    "ENV_IDENTITY_TTL",
    "ENV_LOG_READS",
    "ENV_MAX_BYTES",
    "ENV_POLICY",
    "ENV_READ",
    "ENV_ROOT",
    "FillPolicy",
    "LakehouseCacheConfig",
    "ReadPolicy",
    "config_errors_from_env",
    "resolve_root",
]

ENV_ROOT = "NEXUS_LAKEHOUSE_CACHE_ROOT"
ENV_READ = "NEXUS_LAKEHOUSE_CACHE_READ"
ENV_POLICY = "NEXUS_LAKEHOUSE_CACHE_POLICY"
ENV_MAX_BYTES = "NEXUS_LAKEHOUSE_CACHE_MAX_BYTES"
ENV_FILL_MAX_CONCURRENCY = "NEXUS_LAKEHOUSE_FILL_MAX_CONCURRENCY"
ENV_FILL_MAX_HOST_BYTES = "NEXUS_LAKEHOUSE_FILL_MAX_HOST_BYTES"
ENV_BYPASS_BYTES = "NEXUS_LAKEHOUSE_CACHE_BYPASS_BYTES"
ENV_FILL_EXIT_WAIT_S = "NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S"
ENV_LOG_READS = "NEXUS_LAKEHOUSE_LOG_READS"
ENV_IDENTITY_TTL = "NEXUS_LAKEHOUSE_CACHE_IDENTITY_TTL"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class ReadPolicy(str, enum.Enum):
    """Whether an existing complete entry may serve a read.

    Examples
    --------
    >>> from nexus_cache.lakehouse import ReadPolicy
    >>> ReadPolicy("disabled") is ReadPolicy.DISABLED
    True
    """

    ENABLED = "enabled"
    DISABLED = "disabled"


class FillPolicy(str, enum.Enum):
    """What a miss does: nothing, a background fill, or a fill before the read.

    Examples
    --------
    >>> from nexus_cache.lakehouse import FillPolicy
    >>> [p.value for p in FillPolicy]
    ['disabled', 'read_through', 'fill_before_read']
    """

    DISABLED = "disabled"
    READ_THROUGH = "read_through"
    FILL_BEFORE_READ = "fill_before_read"

    @property
    def fills(self) -> bool:
        return self is not FillPolicy.DISABLED


def _parse_enum(kind: type[enum.Enum], value: Any, name: str) -> Any:
    if isinstance(value, kind):
        return value
    text = str(value).strip().lower()
    for member in kind:
        if member.value == text:
            return member
    accepted = ", ".join(m.value for m in kind)
    raise ConfigError(f"{name}={value!r} is not accepted; use one of: {accepted}")


def _parse_positive_int(value: Any, name: str) -> int:
    try:
        number = parse_int_text(str(value)) if not isinstance(value, int) else value
    except ValueError:
        number = 0
    if isinstance(value, bool) or number <= 0:
        raise ConfigError(f"{name}={value!r} is not accepted; use a whole number >= 1")
    return number


def _parse_seconds(value: Any, name: str) -> float:
    # bool is an int subclass, and NaN compares false with everything: refuse both
    # here, where the value enters, instead of failing later in a timeout. So are
    # values longer than any thread wait (threading.TIMEOUT_MAX, ~292 years):
    # waits on them raise OverflowError (the exit hook's, every blocking fill's).
    try:
        if isinstance(value, bool):
            raise ValueError
        number = parse_float_text(value) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number < 0 or number > threading.TIMEOUT_MAX:
        raise ConfigError(
            f"{name}={value!r} is not accepted; use a finite number of seconds >= 0 "
            f"and at most {threading.TIMEOUT_MAX:.0f}"
        )
    return number


def _parse_flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{name}={value!r} is not accepted; use 1/true/yes/on or 0/false/no/off")


def _check_root(value: Any) -> Path:
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise ConfigError(
            f"{ENV_ROOT}={value!r} is not accepted: the cache root is a directory path "
            f"(a string), not {type(value).__name__}; quote it, or leave it unset for no cache"
        )
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(
            f"{ENV_ROOT}={text!r} is not accepted: an empty root would mean the current "
            "directory; set a directory path, or leave it unset (root=None) for no cache"
        )
    scheme, sep, rest = text.partition("://")
    if sep and scheme.isidentifier():
        if scheme.lower() != "file":
            raise ConfigError(
                f"{ENV_ROOT}={text!r} is not accepted: the cache root is a local directory "
                f"and {scheme}:// is not local (the objects it caches may live on any "
                "fsspec store; its copies live on this machine's disk); set a directory "
                "path such as /var/cache/nexus-lake"
            )
        text = rest
    expanded = os.path.expanduser(text)
    if expanded.startswith("~"):
        # expanduser leaves "~name" as it is when there is no such user (or no
        # HOME): the root would become a directory literally named "~name"
        # under the current directory.
        user = expanded[1:].split("/", 1)[0] or "the current user ($HOME is not set)"
        raise ConfigError(
            f"{ENV_ROOT}={os.fspath(value)!r} is not accepted: {expanded.split('/', 1)[0]!r} "
            f"names no home directory ({user} is unknown here); give the directory's "
            "absolute path"
        )
    root = Path(os.path.abspath(expanded))
    if root.exists() and not root.is_dir():
        raise ConfigError(
            f"{ENV_ROOT}={text!r} is not a directory ({root} exists as a file); "
            "point it at a directory, or remove the file"
        )
    return root


#: how each seconds field is named in messages (the variable, where it has one)
_SECONDS_NAMES = {
    "blocking_fill_timeout_s": "blocking_fill_timeout_s",
    "local_min_age_s": "local_min_age_s",
    "stale_temp_age_s": "stale_temp_age_s",
    "fill_exit_wait_s": ENV_FILL_EXIT_WAIT_S,
    "identity_ttl_s": ENV_IDENTITY_TTL,
}


@dataclasses.dataclass(frozen=True)
class LakehouseCacheConfig:
    """Immutable settings of one lakehouse cache; validated on construction.

    ``root=None`` means no cache: every read is remote and nothing is filled.
    The constructor accepts strings for the enum and size fields, so
    ``LakehouseCacheConfig(root="/c", policy="read_through", max_bytes="10GiB")``
    works. ``blocking_fill_timeout_s``, ``local_min_age_s``, ``stale_temp_age_s``
    and ``event_buffer`` have no environment variable.

    Parameters
    ----------
    root : str, os.PathLike or None, optional
        The cache directory (``~`` expanded, made absolute); None: no cache.
    read : ReadPolicy or str, optional
        Whether a complete entry may serve a read.
    policy : FillPolicy or str, optional
        What a miss does.
    max_bytes : int, str or None, optional
        The cache's size bound (``"10GiB"``); required by a filling policy.
    fill_max_concurrency : int, optional
        Fills running at once.
    fill_max_host_bytes : int or str, optional
        Host bytes all running fills may hold.
    bypass_bytes : int, str or None, optional
        Objects larger than this are read remotely and never filled.
    blocking_fill_timeout_s, local_min_age_s, stale_temp_age_s : float, optional
        As the field comments say.
    event_buffer : int, optional
        Capacity of each event ring buffer.
    fill_exit_wait_s : float, optional
        Seconds the interpreter waits at exit for background fills.
    log_reads : bool, optional
        Log every read's diagnostics at INFO.
    identity_ttl_s : float, optional
        Seconds a proven remote identity is reused without a request.

    Raises
    ------
    ConfigError
        A field is not valid, or a filling policy has no ``max_bytes``; the
        message names the field.

    Examples
    --------
    >>> from nexus_cache.lakehouse import LakehouseCacheConfig
    >>> config = LakehouseCacheConfig(root="/c", policy="read_through", max_bytes="10GiB")
    >>> config.policy.value, config.max_bytes
    ('read_through', 10737418240)
    >>> LakehouseCacheConfig(root="/c", policy="read_through")
    Traceback (most recent call last):
    ...
    nexus_cache.errors.ConfigError: ...NEXUS_LAKEHOUSE_CACHE_MAX_BYTES is required; ...
    """

    root: Path | None = None
    read: ReadPolicy = ReadPolicy.ENABLED
    policy: FillPolicy = FillPolicy.DISABLED
    max_bytes: int | None = None
    fill_max_concurrency: int = 4
    fill_max_host_bytes: int = 2 * 1024**3
    bypass_bytes: int | None = None
    #: how long a blocking fill waits for the entry lock and the fill budget
    blocking_fill_timeout_s: float = 120.0
    #: a local file is trusted (size, mtime_ns, inode) only when older than this
    local_min_age_s: float = 3.0
    #: temps older than this are swept at open even if their creator looks alive
    stale_temp_age_s: float = 3600.0
    #: capacity of each event ring buffer
    event_buffer: int = 1024
    #: seconds the interpreter waits at exit for background fills to publish
    fill_exit_wait_s: float = 30.0
    #: log every read's diagnostics at INFO (``nexus_cache.lakehouse`` logger)
    log_reads: bool = False
    #: seconds a proven remote identity is reused without a request (0: never)
    identity_ttl_s: float = 0.0

    def __post_init__(self) -> None:
        errors: list[str] = []
        set_ = object.__setattr__

        def check(field: str, parse: Any) -> None:
            try:
                set_(self, field, parse(getattr(self, field)))
            except ConfigError as exc:
                errors.append(str(exc))

        def optional_size(name: str) -> Any:
            return lambda v: None if v is None else parse_size(v, name=name)

        check("root", lambda v: None if v is None else _check_root(v))
        check("read", lambda v: _parse_enum(ReadPolicy, v, ENV_READ))
        check("policy", lambda v: _parse_enum(FillPolicy, v, ENV_POLICY))
        check("max_bytes", optional_size(ENV_MAX_BYTES))
        check("fill_max_concurrency", lambda v: _parse_positive_int(v, ENV_FILL_MAX_CONCURRENCY))
        check("fill_max_host_bytes", lambda v: parse_size(v, name=ENV_FILL_MAX_HOST_BYTES))
        check("bypass_bytes", optional_size(ENV_BYPASS_BYTES))
        for field, name in _SECONDS_NAMES.items():
            check(field, lambda v, name=name: _parse_seconds(v, name))
        check("event_buffer", lambda v: _parse_positive_int(v, "event_buffer"))
        check("log_reads", lambda v: _parse_flag(v, ENV_LOG_READS))
        if errors:
            raise ConfigError("; ".join(errors))
        if self.root is not None and self.policy.fills and self.max_bytes is None:
            raise ConfigError(
                f"{ENV_POLICY}={self.policy.value} fills the cache at {self.root}, so "
                f"{ENV_MAX_BYTES} is required; set it (e.g. {ENV_MAX_BYTES}=50GiB) "
                f"or use {ENV_POLICY}=disabled"
            )

    @property
    def enabled(self) -> bool:
        """True when a root is configured (a cache exists at all)."""
        return self.root is not None

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> LakehouseCacheConfig:
        """Build from the ``NEXUS_LAKEHOUSE_*`` variables; ``overrides`` win over them."""
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(name)
            return value if value is not None and value.strip() != "" else None

        kwargs: dict[str, Any] = {}
        if (root := get(ENV_ROOT)) is not None:
            kwargs["root"] = root
        if (read := get(ENV_READ)) is not None:
            kwargs["read"] = read
        if (policy := get(ENV_POLICY)) is not None:
            kwargs["policy"] = policy
        if (max_bytes := get(ENV_MAX_BYTES)) is not None:
            kwargs["max_bytes"] = max_bytes
        if (conc := get(ENV_FILL_MAX_CONCURRENCY)) is not None:
            kwargs["fill_max_concurrency"] = conc
        if (host := get(ENV_FILL_MAX_HOST_BYTES)) is not None:
            kwargs["fill_max_host_bytes"] = host
        if (bypass := get(ENV_BYPASS_BYTES)) is not None:
            kwargs["bypass_bytes"] = bypass
        if (exit_wait := get(ENV_FILL_EXIT_WAIT_S)) is not None:
            kwargs["fill_exit_wait_s"] = exit_wait
        if (log_reads := get(ENV_LOG_READS)) is not None:
            kwargs["log_reads"] = log_reads
        if (ttl := get(ENV_IDENTITY_TTL)) is not None:
            kwargs["identity_ttl_s"] = ttl
        kwargs.update(overrides)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view (for ``nexus-cache lakehouse info``)."""
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, enum.Enum):
                value = value.value
            elif isinstance(value, Path):
                value = str(value)
            out[field.name] = value
        return out


def _env_value(env: Mapping[str, str], name: str) -> str | None:
    # The rule of from_env: an empty or blank value counts as unset.
    value = env.get(name)
    return value if value is not None and value.strip() != "" else None


def resolve_root(
    root: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> Path | None:
    """The cache root ``root`` names, else ``NEXUS_LAKEHOUSE_CACHE_ROOT``; ``None`` when neither.

    Normalised and validated exactly as :class:`LakehouseCacheConfig` does
    (``~`` expanded, made absolute); reads no other variable.

    Parameters
    ----------
    root : str, os.PathLike or None, optional
        A cache directory.
    environ : mapping of str to str or None, optional
        The variables (default: ``os.environ``).

    Returns
    -------
    pathlib.Path or None
        The absolute root, or None when no root is named.

    Raises
    ------
    ConfigError
        The root is empty or not a usable path.

    Examples
    --------
    >>> from nexus_cache.lakehouse import resolve_root
    >>> resolve_root("/data/../cache", environ={})
    PosixPath('/cache')
    >>> resolve_root(environ={"NEXUS_LAKEHOUSE_CACHE_ROOT": "/cache"})
    PosixPath('/cache')
    >>> resolve_root(environ={}) is None
    True
    """
    if root is None or os.fspath(root).strip() == "":
        env = os.environ if environ is None else environ
        root = _env_value(env, ENV_ROOT)
        if root is None:
            return None
    return _check_root(root)


def config_errors_from_env(environ: Mapping[str, str] | None = None) -> list[ConfigError]:
    """Every problem of the ``NEXUS_LAKEHOUSE_*`` variables, not only the first.

    Each variable is checked on its own; when all pass, the combination is
    checked as :meth:`LakehouseCacheConfig.from_env` does (a filling policy
    needs ``MAX_BYTES``). An empty list means ``from_env`` succeeds.

    Parameters
    ----------
    environ : mapping of str to str or None, optional
        The variables to check (default: ``os.environ``).

    Returns
    -------
    list of ConfigError
        One error per problem, each naming its variable.

    Examples
    --------
    >>> from nexus_cache.lakehouse import config_errors_from_env
    >>> config_errors_from_env({"NEXUS_LAKEHOUSE_CACHE_ROOT": "/c"})
    []
    >>> [str(e)[:46] for e in config_errors_from_env({"NEXUS_LAKEHOUSE_CACHE_MAX_BYTES": "ten"})]
    ["NEXUS_LAKEHOUSE_CACHE_MAX_BYTES='ten' is not a"]
    """
    env = os.environ if environ is None else environ
    errors: list[ConfigError] = []
    # Each variable alone, through from_env itself: whatever variables
    # from_env reads are checked, with its rules, and no error hides another.
    names = sorted(n for n in env if n.startswith("NEXUS_LAKEHOUSE_"))
    for name in names:
        value = _env_value(env, name)
        if value is None:
            continue
        try:
            LakehouseCacheConfig.from_env({name: value})
        except ConfigError as exc:
            errors.append(exc)
    if not errors:
        try:
            LakehouseCacheConfig.from_env(env)
        except ConfigError as exc:
            errors.append(exc)
    return errors
