"""Settings of ``nexus-cache serve``: :class:`ServerSettings`.

Sources, weakest first: defaults, the ``[server]`` table of the service's TOML
file (``--config`` or ``NEXUS_SERVICE_CONFIG``), the ``NEXUS_SERVER_*``
variables, then the command line. Every value is validated where it enters;
a bad one raises :class:`ConfigError` naming the option, key or variable.
Immutable; thread-safe to share.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from nexus_cache._env import Variable, environ_of, raw, read
from nexus_cache._roots import parse_roots
from nexus_cache._sizes import parse_size
from nexus_cache.errors import ConfigError

__all__ = [
    "DEFAULT_PORT",
    "ENV_SERVER_TOKEN",
    "ENV_SERVER_URL",
    "MALLOC_VARIABLE",
    "TLS_ROOT_CERTS_VARIABLE",
    "TOKEN_VARIABLE",
    "URL_VARIABLE",
    "VARIABLES",
    "ServerSettings",
    "header_safe",
    "is_loopback",
    "load_settings",
    "read_token_file",
]

DEFAULT_PORT = 8815
TOKEN_VARIABLE = Variable(
    "NEXUS_SERVER_TOKEN",
    "str",
    "Server: every call must carry `authorization: Bearer <token>`",
    unset="unset: no authentication (loopback only)",
)
URL_VARIABLE = Variable(
    "NEXUS_SERVER_URL",
    "str",
    "Client commands: the server to run on, as `--server URL`.",
    unset="unset: run in this process",
)
TLS_ROOT_CERTS_VARIABLE = Variable(
    "NEXUS_SERVER_TLS_ROOT_CERTS",
    "str",
    "Client commands: the CA certificate (or the self-signed certificate)",
    unset="unset: the system's root certificates",
)
#: glibc's own, read by glibc; the server trims freed memory whatever it says
MALLOC_VARIABLE = Variable(
    "MALLOC_MMAP_THRESHOLD_",
    "str",
    "glibc's mmap threshold",
    unset="unset: glibc's own (freed blocks are reused; the server trims them every 0.5 s)",
)
#: the variables that override the [server] keys, each naming its key
_KEYED = (
    Variable(
        "NEXUS_SERVER_MAX_RUNNING_QUERIES",
        "int",
        "Queries the server executes at once; more wait.",
        default="8",
        minimum=1,
        field="max_running_queries",
    ),
    Variable(
        "NEXUS_SERVER_QUEUE_TIMEOUT_S",
        "float",
        "How long a query waits for one of those slots",
        default="30",
        minimum=0,
        unit="seconds",
        field="queue_timeout_s",
    ),
    Variable(
        "NEXUS_SERVER_MAX_TICKET_BYTES",
        "size",
        "Largest ticket (query JSON) accepted.",
        default="64KiB",
        field="max_ticket_bytes",
    ),
    Variable(
        "NEXUS_SERVER_SHUTDOWN_TIMEOUT_S",
        "float",
        "On SIGTERM or the `shutdown` action",
        default="10",
        minimum=0,
        unit="seconds",
        field="shutdown_timeout_s",
    ),
)
#: the variables of the server and of its client commands
VARIABLES = (TOKEN_VARIABLE, URL_VARIABLE, TLS_ROOT_CERTS_VARIABLE, *_KEYED, MALLOC_VARIABLE)
ENV_SERVER_TOKEN = TOKEN_VARIABLE.name
ENV_SERVER_URL = URL_VARIABLE.name
#: [server] key -> variable that overrides it
_ENV = {str(v.field): v for v in _KEYED}
ENV_MAX_RUNNING = _ENV["max_running_queries"].name
_TOML_KEYS = ("allowed_roots", *_ENV)


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """How the server listens and what it accepts.

    ``token``: every call must carry ``authorization: Bearer <token>``
    (None: no authentication, allowed on loopback only unless
    ``allow_unauthenticated``). ``allowed_roots``: the only local directories
    or URL prefixes a query may name (None: anything the server's user can
    read). ``max_running_queries`` queries run at once; more wait up to
    ``queue_timeout_s``. A ticket is at most ``max_ticket_bytes``.
    ``shutdown_timeout_s`` bounds how long running queries are waited for.
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    metrics_port: int | None = None
    token: str | None = dataclasses.field(default=None, repr=False)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    allow_unauthenticated: bool = False
    allowed_roots: tuple[str, ...] | None = None
    max_running_queries: int = 8
    queue_timeout_s: float = 30.0
    max_ticket_bytes: int = 64 << 10
    shutdown_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if not isinstance(self.host, str) or not self.host.strip():
            raise ConfigError(f"--host={self.host!r} is not accepted; use an address or name")
        for name in ("port", "metrics_port"):
            value = getattr(self, name)
            if value is None and name == "metrics_port":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 65536:
                option = "--" + name.replace("_", "-")
                raise ConfigError(f"{option}={value!r} is not accepted; use a port 0..65535")
        if self.token is not None and (not isinstance(self.token, str) or not self.token.strip()):
            raise ConfigError(
                f"{ENV_SERVER_TOKEN} (or --token-file) is empty; give a token or leave it unset"
            )
        if self.token is not None and not header_safe(self.token.strip()):
            raise ConfigError(
                f"{ENV_SERVER_TOKEN} (or --token-file) holds a character that a call header "
                "cannot carry (no client could send it); use a token of printable ASCII "
                "characters only, without accents, tabs or line breaks"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together; give both or neither")
        for option, path in (("--tls-cert", self.tls_cert), ("--tls-key", self.tls_key)):
            if path is not None and not os.access(path, os.R_OK):
                raise ConfigError(f"{option}={str(path)!r} is not a readable file; fix the path")
        if self.allowed_roots is not None:
            set_(self, "allowed_roots", parse_roots(self.allowed_roots, "[server] allowed_roots"))
        running = self.max_running_queries
        if isinstance(running, bool) or not isinstance(running, int) or running < 1:
            raise ConfigError(
                f"max_running_queries={running!r} is not accepted ({ENV_MAX_RUNNING}); "
                "use a whole number >= 1"
            )
        for name in ("queue_timeout_s", "shutdown_timeout_s"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise ConfigError(
                    f"{name}={value!r} is not accepted ({_ENV[name].name}); use a finite number "
                    "of seconds >= 0"
                )
        set_(self, "max_ticket_bytes", parse_size(self.max_ticket_bytes, name="max_ticket_bytes"))

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def url(self) -> str:
        """The URL clients use (``grpc://`` or ``grpc+tls://``)."""
        return self.url_with_port(self.port)

    def url_with_port(self, port: int) -> str:
        """:attr:`url` with another port (the one ``port=0`` got)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'grpc+tls' if self.tls else 'grpc'}://{host}:{port}"

    def check_exposure(self) -> None:
        """Refuse a non-loopback bind without a token unless ``allow_unauthenticated``."""
        if self.token is None and not self.allow_unauthenticated and not is_loopback(self.host):
            raise ConfigError(
                f"--host {self.host} is not a loopback address and no token is set: anyone who "
                f"reaches it could read what this server's user can read; set {ENV_SERVER_TOKEN} "
                "or --token-file, or pass --allow-unauthenticated"
            )


def header_safe(token: str) -> bool:
    """Whether ``token`` can travel in a call header: printable ASCII only (gRPC
    refuses any other character, so a token with an accent, a tab or a line break
    could never be sent)."""
    return all(" " <= ch <= "~" for ch in token)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in ``path`` (surrounding whitespace removed); ConfigError names the file."""
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"--token-file={str(path)!r} cannot be read ({exc}); fix the path"
        ) from None
    if not text:
        raise ConfigError(f"--token-file={str(path)!r} is empty; write the token into it")
    return text


def load_settings(
    config_path: str | os.PathLike[str] | None,
    environ: Mapping[str, str] | None = None,
    **options: Any,
) -> ServerSettings:
    """Defaults, the ``[server]`` table of ``config_path`` (else ``NEXUS_SERVICE_CONFIG``),
    the ``NEXUS_SERVER_*`` variables, then ``options`` (None values are skipped)."""
    from nexus_cache.service.config import CONFIG_VARIABLE

    env = environ_of(environ)
    path = config_path if config_path is not None else raw(CONFIG_VARIABLE, env)
    fields: dict[str, Any] = {} if path is None else _read_table(Path(path))
    for key, variable in _ENV.items():
        if raw(variable, env) is not None:
            fields[key] = read(variable, env)
    if (token := read(TOKEN_VARIABLE, env)) is not None:
        fields["token"] = token
    fields.update({k: v for k, v in options.items() if v is not None})
    return ServerSettings(**fields)


def _read_table(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config={str(path)!r} cannot be read ({exc}); fix the file") from None
    table = data.get("server", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: server={table!r}; accepted: a [server] table")
    for key, value in table.items():
        if key not in _TOML_KEYS:
            raise ConfigError(
                f"{path} [server]: unknown key {key!r}; accepted keys: {', '.join(_TOML_KEYS)}"
            )
        try:  # checked one by one, so that the error names the file
            ServerSettings(**{key: value})
        except ConfigError as exc:
            said = str(exc)
            where = f"{path} " if said.startswith("[server]") else f"{path} [server]: "
            raise ConfigError(where + said) from None
    return dict(table)
