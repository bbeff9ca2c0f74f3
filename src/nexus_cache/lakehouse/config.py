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

Byte sizes are a whole number with an optional unit: ``B``, decimal ``KB MB GB TB``
(powers of 1000) or binary ``KiB MiB GiB TiB`` (powers of 1024), case-insensitive,
e.g. ``10GiB``. Bare letters (``10G``) are refused because they are ambiguous.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nexus_cache._sizes import parse_size
from nexus_cache.errors import ConfigError

__all__ = [
    "ENV_BYPASS_BYTES",
    "ENV_FILL_MAX_CONCURRENCY",
    "ENV_FILL_MAX_HOST_BYTES",
    "ENV_MAX_BYTES",
    "ENV_POLICY",
    "ENV_READ",
    "ENV_ROOT",
    "FillPolicy",
    "LakehouseCacheConfig",
    "ReadPolicy",
    "config_errors_from_env",
    "parse_byte_size",
    "resolve_root",
]

ENV_ROOT = "NEXUS_LAKEHOUSE_CACHE_ROOT"
ENV_READ = "NEXUS_LAKEHOUSE_CACHE_READ"
ENV_POLICY = "NEXUS_LAKEHOUSE_CACHE_POLICY"
ENV_MAX_BYTES = "NEXUS_LAKEHOUSE_CACHE_MAX_BYTES"
ENV_FILL_MAX_CONCURRENCY = "NEXUS_LAKEHOUSE_FILL_MAX_CONCURRENCY"
ENV_FILL_MAX_HOST_BYTES = "NEXUS_LAKEHOUSE_FILL_MAX_HOST_BYTES"
ENV_BYPASS_BYTES = "NEXUS_LAKEHOUSE_CACHE_BYPASS_BYTES"


class ReadPolicy(str, enum.Enum):
    """Whether an existing complete entry may serve a read."""

    ENABLED = "enabled"
    DISABLED = "disabled"


class FillPolicy(str, enum.Enum):
    """What a miss does: nothing, a background fill, or a fill before the read."""

    DISABLED = "disabled"
    READ_THROUGH = "read_through"
    FILL_BEFORE_READ = "fill_before_read"

    @property
    def fills(self) -> bool:
        return self is not FillPolicy.DISABLED


def parse_byte_size(value: str | int, *, name: str) -> int:
    """Parse ``value`` ("10GiB", "500MB", "64M", 1048576) to a positive byte count.

    The package's one size grammar (:mod:`nexus_cache._sizes`); raises
    :class:`ConfigError` naming ``name``, the value and the accepted forms.
    """
    return parse_size(value, name=name)


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
        number = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        number = 0
    if isinstance(value, bool) or number <= 0:
        raise ConfigError(f"{name}={value!r} is not accepted; use a whole number >= 1")
    return number


@dataclasses.dataclass(frozen=True)
class LakehouseCacheConfig:
    """Immutable settings of one lakehouse cache; validated on construction.

    ``root=None`` means no cache: every read is remote and nothing is filled.
    The constructor accepts strings for the enum and size fields, so
    ``LakehouseCacheConfig(root="/c", policy="read_through", max_bytes="10GiB")``
    works. Fields past ``bypass_bytes`` have no environment variable.
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

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.root is not None:
            root = Path(os.path.expanduser(os.fspath(self.root)))
            set_(self, "root", Path(os.path.abspath(root)))
        set_(self, "read", _parse_enum(ReadPolicy, self.read, ENV_READ))
        set_(self, "policy", _parse_enum(FillPolicy, self.policy, ENV_POLICY))
        if self.max_bytes is not None:
            set_(self, "max_bytes", parse_byte_size(self.max_bytes, name=ENV_MAX_BYTES))
        set_(
            self,
            "fill_max_concurrency",
            _parse_positive_int(self.fill_max_concurrency, ENV_FILL_MAX_CONCURRENCY),
        )
        set_(
            self,
            "fill_max_host_bytes",
            parse_byte_size(self.fill_max_host_bytes, name=ENV_FILL_MAX_HOST_BYTES),
        )
        if self.bypass_bytes is not None:
            set_(self, "bypass_bytes", parse_byte_size(self.bypass_bytes, name=ENV_BYPASS_BYTES))
        for field in ("blocking_fill_timeout_s", "local_min_age_s", "stale_temp_age_s"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"{field}={value!r} is not accepted; use seconds >= 0")
        set_(self, "event_buffer", _parse_positive_int(self.event_buffer, "event_buffer"))
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
    """
    if root is None or os.fspath(root).strip() == "":
        env = os.environ if environ is None else environ
        root = _env_value(env, ENV_ROOT)
        if root is None:
            return None
    return LakehouseCacheConfig(root=root).root


def config_errors_from_env(environ: Mapping[str, str] | None = None) -> list[ConfigError]:
    """Every problem of the ``NEXUS_LAKEHOUSE_*`` variables, not only the first.

    Each variable is checked on its own; when all pass, the combination is
    checked as :meth:`LakehouseCacheConfig.from_env` does (a filling policy
    needs ``MAX_BYTES``). An empty list means ``from_env`` succeeds.
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
