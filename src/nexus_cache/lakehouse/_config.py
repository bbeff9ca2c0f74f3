"""Configuration of the lakehouse byte cache.

:class:`LakehouseCacheConfig` is an immutable value; :meth:`LakehouseCacheConfig.from_env`
reads exactly the variables of :data:`VARIABLES` (through :mod:`nexus_cache._env`: an
empty value counts as unset), each of which sets one field. ``docs/configuration.md``
describes them.

Byte sizes use the package's one grammar (:mod:`nexus_cache._sizes`): plain bytes,
``64M``/``10G``/``10GiB`` (powers of 1024) or ``500MB``/``10GB`` (powers of 1000).
Seconds are finite numbers ``>= 0``. Every refused value raises
:class:`~nexus_cache.errors.ConfigError` naming the setting; a configuration with
several bad values names all of them in one error.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nexus_cache._env import (
    Variable,
    environ_of,
    parse_choice,
    parse_flag,
    parse_number,
    parse_whole,
    raw,
    read_fields,
)
from nexus_cache._sizes import parse_size
from nexus_cache.errors import ConfigError

__all__ = [
    "BY_FIELD",
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
    "VARIABLES",
    "LakehouseCacheConfig",
    "ReadPolicy",
    "config_errors_from_env",
    "resolve_root",
]


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


#: the variables :meth:`LakehouseCacheConfig.from_env` reads, and the fields they set
VARIABLES = (
    Variable(
        "NEXUS_LAKEHOUSE_CACHE_ROOT",
        "path",
        "Where entries live.",
        unset="unset: no cache, every read remote",
        field="root",
    ),
    Variable(
        "NEXUS_LAKEHOUSE_CACHE_READ",
        "enum",
        "May an existing entry serve a read?",
        default="enabled",
        choices=tuple(m.value for m in ReadPolicy),
        field="read",
    ),
    Variable(
        "NEXUS_LAKEHOUSE_CACHE_POLICY",
        "enum",
        "What a miss does: nothing, a background fill, or a fill before the read.",
        default="disabled",
        choices=tuple(m.value for m in FillPolicy),
        field="policy",
    ),
    Variable(
        "NEXUS_LAKEHOUSE_CACHE_MAX_BYTES",
        "size",
        "Best-effort LRU target of the entries' bytes.",
        unset="unset",
        field="max_bytes",
    ),
    Variable(
        "NEXUS_LAKEHOUSE_FILL_MAX_CONCURRENCY",
        "int",
        "Fills running at once in one process.",
        default="4",
        minimum=1,
        field="fill_max_concurrency",
    ),
    Variable(
        "NEXUS_LAKEHOUSE_FILL_MAX_HOST_BYTES",
        "size",
        "Object bytes in flight through fills at once in one process.",
        default="2GiB",
        field="fill_max_host_bytes",
    ),
    Variable(
        "NEXUS_LAKEHOUSE_CACHE_BYPASS_BYTES",
        "size",
        "Objects larger than this are never cached",
        unset="unset: no threshold",
        field="bypass_bytes",
    ),
    Variable(
        "NEXUS_LAKEHOUSE_FILL_EXIT_WAIT_S",
        "float",
        "How long the interpreter waits at exit for queued and running background fills "
        "to publish",
        default="30",
        minimum=0,
        maximum=threading.TIMEOUT_MAX,
        unit="seconds",
        field="fill_exit_wait_s",
    ),
    Variable(
        "NEXUS_LAKEHOUSE_LOG_READS",
        "bool",
        "Log every read's status, read mode and fill mode at INFO",
        default="off",
        field="log_reads",
    ),
    Variable(
        "NEXUS_LAKEHOUSE_CACHE_IDENTITY_TTL",
        "float",
        "Opt-in staleness window",
        default="0",
        minimum=0,
        maximum=threading.TIMEOUT_MAX,
        unit="seconds",
        field="identity_ttl_s",
    ),
)
#: the variable of each field it sets
BY_FIELD = {v.field: v for v in VARIABLES}
(
    ENV_ROOT,
    ENV_READ,
    ENV_POLICY,
    ENV_MAX_BYTES,
    ENV_FILL_MAX_CONCURRENCY,
    ENV_FILL_MAX_HOST_BYTES,
    ENV_BYPASS_BYTES,
    ENV_FILL_EXIT_WAIT_S,
    ENV_LOG_READS,
    ENV_IDENTITY_TTL,
) = (v.name for v in VARIABLES)


def _parse_enum(kind: type[enum.Enum], value: Any, name: str) -> Any:
    if isinstance(value, kind):
        return value
    return kind(parse_choice(value, name, tuple(m.value for m in kind)))


def _parse_seconds(value: Any, name: str) -> float:
    # Values longer than any thread wait (threading.TIMEOUT_MAX, ~292 years) are
    # refused here, where they enter: waits on them raise OverflowError (the exit
    # hook's, every blocking fill's).
    return parse_number(value, name, minimum=0, maximum=threading.TIMEOUT_MAX, unit="seconds")


def _check_root(value: Any, name: str = ENV_ROOT) -> Path:
    """The root ``value`` names, absolute; ``ConfigError`` naming ``name`` (the
    setting the user gave: the variable, or an option that stands for it)."""
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise ConfigError(
            f"{name}={value!r} is not accepted: the cache root is a directory path "
            f"(a string), not {type(value).__name__}; quote it, or leave it unset for no cache"
        )
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(
            f"{name}={text!r} is not accepted: an empty root would mean the current "
            "directory; set a directory path, or leave it unset (root=None) for no cache"
        )
    if "\0" in text:
        # no path can hold one: os calls would fail later with a bare
        # "ValueError: embedded null byte" naming neither setting nor path
        raise ConfigError(
            f"{name}={text!r} is not accepted: a path cannot contain a NUL character "
            "(\\x00); give the cache directory's path"
        )
    scheme, sep, rest = text.partition("://")
    if sep and scheme.isidentifier():
        if scheme.lower() != "file":
            raise ConfigError(
                f"{name}={text!r} is not accepted: the cache root is a local directory "
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
            f"{name}={os.fspath(value)!r} is not accepted: {expanded.split('/', 1)[0]!r} "
            f"names no home directory ({user} is unknown here); give the directory's "
            "absolute path"
        )
    root = Path(os.path.abspath(expanded))
    if root.exists() and not root.is_dir():
        raise ConfigError(
            f"{name}={text!r} is not a directory ({root} exists as a file); "
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
        check(
            "fill_max_concurrency",
            lambda v: parse_whole(v, ENV_FILL_MAX_CONCURRENCY, minimum=1),
        )
        check("fill_max_host_bytes", lambda v: parse_size(v, name=ENV_FILL_MAX_HOST_BYTES))
        check("bypass_bytes", optional_size(ENV_BYPASS_BYTES))
        for field, name in _SECONDS_NAMES.items():
            check(field, lambda v, name=name: _parse_seconds(v, name))
        check("event_buffer", lambda v: parse_whole(v, "event_buffer", minimum=1))
        check("log_reads", lambda v: parse_flag(v, ENV_LOG_READS))
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
        kwargs: dict[str, Any] = dict(read_fields(VARIABLES, environ))
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
        root = raw(BY_FIELD["root"], environ)
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
    env = environ_of(environ)
    errors: list[ConfigError] = []
    # Each variable alone, through from_env itself: whatever variables
    # from_env reads are checked, with its rules, and no error hides another.
    for variable in sorted(VARIABLES, key=lambda v: v.name):
        value = raw(variable, env)
        if value is None:
            continue
        try:
            LakehouseCacheConfig.from_env({variable.name: value})
        except ConfigError as exc:
            errors.append(exc)
    if not errors:
        try:
            LakehouseCacheConfig.from_env(env)
        except ConfigError as exc:
            errors.append(exc)
    return errors
