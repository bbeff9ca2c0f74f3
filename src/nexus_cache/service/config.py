"""Configuration of the query service: :class:`ServiceConfig`.

Sources, weakest first: built-in defaults, a TOML file, the environment, then
keyword overrides. :meth:`ServiceConfig.load` applies them in that order; every
value is validated where it enters, and a bad one raises :class:`ConfigError`
naming the key (or variable), the value and what is accepted.

Environment variables: :data:`VARIABLES`, ``NEXUS_DEVICE_BACKEND`` and the
lakehouse cache's ``NEXUS_LAKEHOUSE_*`` (read through :mod:`nexus_cache._env`:
an empty value counts as unset); ``docs/configuration.md`` describes them.

Immutable; thread-safe to share.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from nexus_cache._env import Variable, environ_of, parse_number, parse_whole, raw, read_fields
from nexus_cache._roots import parse_roots
from nexus_cache._sizes import parse_size
from nexus_cache.backends import BACKEND_NAMES, BACKEND_VARIABLE
from nexus_cache.errors import ConfigError
from nexus_cache.lakehouse import VARIABLES as LAKEHOUSE_VARIABLES
from nexus_cache.lakehouse import LakehouseCacheConfig

__all__ = [
    "DEFAULT_CACHE_CAP_FRACTION",
    "MAX_GRANT_EXPANSION",
    "DeviceSettings",
    "CONFIG_VARIABLE",
    "ENV_CONFIG",
    "ENV_EVIDENCE_DIR",
    "VARIABLES",
    "ServiceConfig",
    "load_lakehouse_config",
    "load_lakehouse_root",
]

#: share of a device's managed capacity a device without a configured cap gets
DEFAULT_CACHE_CAP_FRACTION = 0.25
#: largest accepted ``grant_expansion``: decoded data is rarely more than a few
#: dozen times its Parquet bytes, and far larger factors overflow the grant
#: arithmetic (a float too large for an int)
MAX_GRANT_EXPANSION = 1024.0

CONFIG_VARIABLE = Variable(
    "NEXUS_SERVICE_CONFIG", "path", "Path of a TOML file read first.", unset="none"
)
_DEVICES = Variable(
    "NEXUS_SERVICE_DEVICES",
    "str",
    "Comma-separated device ids to serve.",
    unset="every device of the backend",
)
#: the variables :meth:`ServiceConfig.load` reads (and the fields they set), beside
#: ``NEXUS_DEVICE_BACKEND`` and the lakehouse cache's
VARIABLES = (
    CONFIG_VARIABLE,
    _DEVICES,
    Variable(
        "NEXUS_DEVICE_CACHE_CAP_BYTES",
        "size",
        "`cache_cap_bytes` of every served device",
        unset="25% of each device's managed capacity",
        minimum=0,
        field="cache_cap_bytes",
    ),
    Variable(
        "NEXUS_SERVICE_EVIDENCE_DIR",
        "path",
        "Directory of the admission TSV and the sealed attempt evidence.",
        unset="none: nothing written",
        field="evidence_dir",
    ),
    Variable(
        "NEXUS_SERVICE_ADMISSION_TIMEOUT_S",
        "float",
        "Seconds an attempt waits for its grant before `AdmissionError`.",
        default="30",
        minimum=0,
        unit="seconds",
        field="admission_timeout_s",
    ),
    Variable(
        "NEXUS_SERVICE_IDLE_RELEASE_S",
        "float",
        "Seconds a device's working memory keeps its freed blocks after the last query "
        "on it ended (0: hand them back at once).",
        default="5",
        minimum=0,
        unit="seconds",
        field="idle_release_s",
    ),
    Variable(
        "NEXUS_SERVICE_MAX_ATTEMPTS",
        "int",
        "Attempts per query, the first included, on transient failures.",
        default="3",
        minimum=1,
        field="max_attempts",
    ),
    Variable(
        "NEXUS_SERVICE_GRANT_EXPANSION",
        "float",
        "Grant bytes asked per byte of Parquet read",
        default="8.0",
        minimum=0,
        strict=True,
        maximum=MAX_GRANT_EXPANSION,
        field="grant_expansion",
    ),
)
_FIELDS = {v: v.field for v in VARIABLES if v.field is not None}
ENV_CONFIG = CONFIG_VARIABLE.name
ENV_DEVICES = _DEVICES.name
ENV_EVIDENCE_DIR = next(v.name for v, field in _FIELDS.items() if field == "evidence_dir")


_LAKEHOUSE_KEYS = tuple(f.name for f in dataclasses.fields(LakehouseCacheConfig))
_TOP_KEYS = (
    "backend",
    "evidence_dir",
    "admission_timeout_s",
    "idle_release_s",
    "max_attempts",
    "grant_expansion",
    "min_grant_bytes",
    "cache_cap_bytes",
    "devices",
    "lakehouse",
    "storage_options",
    # read by ``nexus-cache serve`` (docs/server.md), not by the service
    "server",
)
_DEVICE_KEYS = ("id", "cache_cap_bytes", "managed_capacity_bytes")


@dataclasses.dataclass(frozen=True)
class DeviceSettings:
    """One served device. ``cache_cap_bytes=None``: :data:`DEFAULT_CACHE_CAP_FRACTION`
    of the managed capacity; ``managed_capacity_bytes=None``: 90% of the device."""

    device_id: int
    cache_cap_bytes: int | None = None
    managed_capacity_bytes: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.device_id, bool) or not isinstance(self.device_id, int):
            raise ConfigError(f"devices.id={self.device_id!r}; accepted: an int >= 0")
        if self.device_id < 0:
            raise ConfigError(f"devices.id={self.device_id!r}; accepted: an int >= 0")
        if self.cache_cap_bytes is not None:
            cap = parse_size(self.cache_cap_bytes, name="cache_cap_bytes", allow_zero=True)
            object.__setattr__(self, "cache_cap_bytes", cap)
        if self.managed_capacity_bytes is not None:
            managed = parse_size(self.managed_capacity_bytes, name="managed_capacity_bytes")
            object.__setattr__(self, "managed_capacity_bytes", managed)


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """Settings of one :class:`~nexus_cache.service.QueryService`. Validated on construction.

    ``devices=None`` serves every device of the backend, each with
    ``cache_cap_bytes`` (``None``: :data:`DEFAULT_CACHE_CAP_FRACTION` of its
    managed capacity). ``evidence_dir=None`` seals evidence in memory only (its
    digests are in each result's attempts); the result fingerprint is then left
    out of it and computed when first read.
    """

    backend: str = "auto"
    devices: tuple[DeviceSettings, ...] | None = None
    cache_cap_bytes: int | None = None
    lakehouse: LakehouseCacheConfig = dataclasses.field(default_factory=LakehouseCacheConfig)
    evidence_dir: Path | None = None
    admission_timeout_s: float = 30.0
    #: seconds each device's working memory keeps its freed blocks once the last
    #: query on it ended, so that the next query reuses them (0: at once)
    idle_release_s: float = 5.0
    max_attempts: int = 3
    grant_expansion: float = 8.0
    min_grant_bytes: int = 1 << 20
    #: fsspec options for remote sources (e.g. ``{"client_kwargs": {"endpoint_url": ...}}``)
    storage_options: Mapping[str, Any] | None = None
    #: the only directories and URL prefixes a query may read (None: anything);
    #: every object a source expands to is checked (``nexus-cache serve`` sets
    #: it from ``[server] allowed_roots``)
    allowed_roots: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.allowed_roots is not None:
            set_(self, "allowed_roots", parse_roots(self.allowed_roots, "allowed_roots"))
        if self.storage_options is not None:
            if not isinstance(self.storage_options, Mapping):
                raise ConfigError(
                    f"storage_options={self.storage_options!r} is not accepted; use a mapping "
                    "of fsspec options (a [storage_options] table in TOML)"
                )
            set_(self, "storage_options", dict(self.storage_options))
        backend = str(self.backend).strip().lower()
        if backend not in BACKEND_NAMES:
            raise ConfigError(
                f"backend={self.backend!r} is not accepted; use one of: {', '.join(BACKEND_NAMES)}"
            )
        set_(self, "backend", backend)
        if self.devices is not None:
            if isinstance(self.devices, (str, bytes, Mapping)) or not hasattr(
                self.devices, "__iter__"
            ):
                raise ConfigError(
                    f"devices={self.devices!r} is not accepted; use a list of device ids "
                    "or DeviceSettings"
                )
            # a bare id is DeviceSettings(id): devices=[0, 1] reads as it looks
            devices = tuple(
                d if isinstance(d, DeviceSettings) else DeviceSettings(d) for d in self.devices
            )
            if not devices:
                raise ConfigError(
                    "devices=[] is not accepted; list at least one device or omit it"
                )
            ids = [d.device_id for d in devices]
            if len(set(ids)) != len(ids):
                raise ConfigError(f"devices={ids} lists a device twice; list each id once")
            set_(self, "devices", devices)
        if self.cache_cap_bytes is not None:
            cap = parse_size(self.cache_cap_bytes, name="cache_cap_bytes", allow_zero=True)
            set_(self, "cache_cap_bytes", cap)
        if not isinstance(self.lakehouse, LakehouseCacheConfig):
            raise ConfigError(f"lakehouse={self.lakehouse!r}; accepted: a LakehouseCacheConfig")
        if self.evidence_dir is not None:
            if not isinstance(self.evidence_dir, (str, os.PathLike)):
                raise ConfigError(
                    f"evidence_dir={self.evidence_dir!r} is not accepted; give a directory "
                    "path (a string) or omit it"
                )
            text = os.fspath(self.evidence_dir)
            if not text.strip():
                raise ConfigError("evidence_dir='' is not accepted; give a directory or omit it")
            set_(self, "evidence_dir", Path(os.path.abspath(os.path.expanduser(text))))
        set_(
            self,
            "admission_timeout_s",
            parse_number(
                self.admission_timeout_s, "admission_timeout_s", minimum=0, unit="seconds"
            ),
        )
        set_(
            self,
            "idle_release_s",
            parse_number(self.idle_release_s, "idle_release_s", minimum=0, unit="seconds"),
        )
        set_(self, "max_attempts", parse_whole(self.max_attempts, "max_attempts", minimum=1))
        set_(
            self,
            "grant_expansion",
            parse_number(
                self.grant_expansion,
                "grant_expansion",
                minimum=0,
                strict=True,
                maximum=MAX_GRANT_EXPANSION,
            ),
        )
        set_(self, "min_grant_bytes", parse_size(self.min_grant_bytes, name="min_grant_bytes"))

    # -- loading ---------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> ServiceConfig:
        """Defaults, then the TOML file (``path`` or ``NEXUS_SERVICE_CONFIG``), then
        the environment, then ``overrides`` (field names of this class)."""
        env = environ_of(environ)
        accepted = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - accepted)
        if unknown:
            raise ConfigError(
                f"ServiceConfig has no setting {', '.join(unknown)}; accepted: "
                f"{', '.join(sorted(accepted))}"
            )

        fields, lake = _file_and_lake_env(path, env)
        for variable, field in ((BACKEND_VARIABLE, "backend"), *_FIELDS.items()):
            if (value := raw(variable, env)) is not None:
                fields[field] = _named(variable.name, field, value)
        if (value := raw(_DEVICES, env)) is not None:
            fields["devices"] = _parse_device_list(value)
        if "lakehouse" in overrides:
            return cls(**{**fields, **overrides})
        return cls(**{**fields, "lakehouse": _lakehouse(lake), **overrides})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> ServiceConfig:
        """:meth:`load` without a file argument (``NEXUS_SERVICE_CONFIG`` may name one)."""
        return cls.load(None, environ=environ, **overrides)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view, for evidence and ``--json`` output."""
        return {
            "backend": self.backend,
            "devices": None
            if self.devices is None
            else [dataclasses.asdict(d) for d in self.devices],
            "cache_cap_bytes": self.cache_cap_bytes,
            "lakehouse": self.lakehouse.to_dict(),
            "evidence_dir": None if self.evidence_dir is None else str(self.evidence_dir),
            "admission_timeout_s": self.admission_timeout_s,
            "idle_release_s": self.idle_release_s,
            "max_attempts": self.max_attempts,
            "grant_expansion": self.grant_expansion,
            "min_grant_bytes": self.min_grant_bytes,
            # option values may hold credentials: name the keys only
            "storage_options": None
            if self.storage_options is None
            else sorted(self.storage_options),
            "allowed_roots": None if self.allowed_roots is None else list(self.allowed_roots),
        }

    def to_json(self) -> str:
        """Every setting as JSON text, storage options in full (:meth:`from_json` reads it).

        What a cluster sends its workers: plain data they validate again, never
        a pickle. Unlike :meth:`to_dict`, it holds the storage options' values,
        which may be credentials: keep the text where the config itself is kept.

        Returns
        -------
        str
            A JSON object with every field, keys sorted.

        Raises
        ------
        ConfigError
            When a storage option is not plain JSON data (a live session object).

        Examples
        --------
        >>> config = ServiceConfig(backend="host", max_attempts=5)
        >>> ServiceConfig.from_json(config.to_json()) == config
        True
        """
        data = self.to_dict()
        data["storage_options"] = (
            None if self.storage_options is None else dict(self.storage_options)
        )
        try:
            return json.dumps(data, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"the service config cannot be written as JSON ({exc}); give "
                "storage_options plain strings, numbers, lists and tables"
            ) from None

    @classmethod
    def from_json(cls, text: str | bytes) -> ServiceConfig:
        """The config :meth:`to_json` wrote, every value validated again.

        Parameters
        ----------
        text : str or bytes
            JSON text from :meth:`to_json`.

        Returns
        -------
        ServiceConfig

        Raises
        ------
        ConfigError
            When the text is not such a JSON object, names an unknown setting, or
            a value is refused (the message names the setting).

        Examples
        --------
        >>> ServiceConfig.from_json('{"backend": "host", "devices": [{"device_id": 1}]}').devices
        (DeviceSettings(device_id=1, cache_cap_bytes=None, managed_capacity_bytes=None),)
        """
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ConfigError(f"the service config JSON is malformed: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(
                f"the service config JSON is {type(data).__name__}; write it with "
                "ServiceConfig.to_json()"
            )
        try:
            devices = data.pop("devices", None)
            if devices is not None:
                data["devices"] = tuple(DeviceSettings(**d) for d in devices)
            if "lakehouse" in data:
                data["lakehouse"] = LakehouseCacheConfig(**data["lakehouse"])
            return cls(**data)
        except TypeError as exc:  # an unknown key, a devices entry that is no table
            raise ConfigError(
                f"the service config JSON does not fit ServiceConfig ({exc}); write it "
                "with ServiceConfig.to_json()"
            ) from None


def _file_and_lake_env(
    path: str | os.PathLike[str] | None, env: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The TOML file's settings (``path``, else ``NEXUS_SERVICE_CONFIG``) and its
    ``[lakehouse]`` table with the ``NEXUS_LAKEHOUSE_*`` variables laid over it."""
    origin = "path"
    if path is None:
        path, origin = raw(CONFIG_VARIABLE, env), ENV_CONFIG
    fields: dict[str, Any] = {}
    lake: dict[str, Any] = {}
    if path is not None:
        fields, lake = _read_toml(Path(path), origin)
    lake.update(read_fields(LAKEHOUSE_VARIABLES, env))
    return fields, lake


def load_lakehouse_config(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> LakehouseCacheConfig:
    """The lakehouse settings a :class:`ServiceConfig` loaded the same way would hold.

    Weakest first: defaults, the TOML file's ``[lakehouse]`` table (``path``,
    else the file ``NEXUS_SERVICE_CONFIG`` names), the ``NEXUS_LAKEHOUSE_*``
    variables, then ``overrides`` (field names of
    :class:`~nexus_cache.lakehouse.LakehouseCacheConfig`). Reads no other
    service setting, so a bad ``NEXUS_SERVICE_*`` variable does not stop it;
    a bad file does (:class:`ConfigError` naming the file and the key).
    """
    _fields, lake = _file_and_lake_env(path, environ_of(environ))
    return _lakehouse({**lake, **overrides})


def load_lakehouse_root(
    path: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None
) -> Path | None:
    """The lakehouse root alone, by the precedence of :func:`load_lakehouse_config`:
    ``NEXUS_LAKEHOUSE_CACHE_ROOT``, else the TOML file's ``[lakehouse] root``, else
    ``None``. Other settings are not combined (a filling policy without a target
    does not stop it), so maintenance commands find the root whatever they hold."""
    _fields, lake = _file_and_lake_env(path, environ_of(environ))
    root = lake.get("root")
    return None if root is None else _lakehouse({"root": root}).root


def _lakehouse(settings: dict[str, Any]) -> LakehouseCacheConfig:
    try:
        return LakehouseCacheConfig(**settings)
    except TypeError as exc:  # an override that is no field (file keys are checked)
        raise ConfigError(f"lakehouse settings: {exc}") from None


def _named(origin: str, field: str, value: Any) -> Any:
    # Validate here so the error names where the user set it (the variable, or the
    # TOML file's path), not the field alone.
    try:
        overrides: dict[str, Any] = {field: value}
        ServiceConfig(**overrides)
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    return value


def _parse_device_list(value: str) -> tuple[DeviceSettings, ...]:
    ids = []
    for part in value.split(","):
        text = part.strip()
        if not text.isascii() or not text.isdigit():
            raise ConfigError(
                f"{ENV_DEVICES}={value!r} is not accepted; use comma-separated device ids "
                "such as 0,1"
            )
        ids.append(DeviceSettings(int(text)))
    return tuple(ids)


def _read_toml(path: Path, origin: str = ENV_CONFIG) -> tuple[dict[str, Any], dict[str, Any]]:
    """``origin`` names where the path came from (the variable, or ``path``)."""
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{origin}={str(path)!r}: no such file; fix the path") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    except OSError as exc:  # a directory, no permission, ...
        raise ConfigError(
            f"{origin}={str(path)!r} cannot be read ({exc.strerror or exc}); "
            "name a readable TOML file"
        ) from None
    _check_keys(data, _TOP_KEYS, f"{path}")
    fields = {k: v for k, v in data.items() if k not in ("lakehouse", "devices", "server")}
    if "storage_options" in fields and not isinstance(fields["storage_options"], dict):
        raise ConfigError(
            f"{path}: storage_options={fields['storage_options']!r}; accepted: a "
            "[storage_options] table"
        )
    for key, value in fields.items():  # checked as a variable's value is: named by the file
        _named(str(path), key, value)
    lake = data.get("lakehouse", {})
    if not isinstance(lake, dict):
        raise ConfigError(f"{path}: lakehouse={lake!r}; accepted: a [lakehouse] table")
    _check_keys(lake, _LAKEHOUSE_KEYS, f"{path} [lakehouse]")
    for key, value in lake.items():
        # Checked one by one here, so that a bad value is named by its place in
        # the file: LakehouseCacheConfig names the NEXUS_LAKEHOUSE_* variable,
        # which the user did not set.
        try:
            LakehouseCacheConfig(**{key: value})
        except ConfigError as exc:
            raise ConfigError(f"{path} [lakehouse] {key}={value!r}: {exc}") from None
    if "devices" in data:
        entries = data["devices"]
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ConfigError(f"{path}: devices={entries!r}; accepted: [[devices]] tables")
        devices = []
        for entry in entries:
            _check_keys(entry, _DEVICE_KEYS, f"{path} [[devices]]")
            if "id" not in entry:
                raise ConfigError(f"{path} [[devices]]: {entry!r} has no id; add id = N")
            devices.append(
                DeviceSettings(
                    entry["id"], entry.get("cache_cap_bytes"), entry.get("managed_capacity_bytes")
                )
            )
        fields["devices"] = tuple(devices)
    return fields, dict(lake)


def _check_keys(data: Mapping[str, Any], accepted: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in accepted:
            raise ConfigError(
                f"{where}: unknown key {key!r}; accepted keys: {', '.join(accepted)}"
            )
