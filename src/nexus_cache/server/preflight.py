"""What ``nexus-cache serve`` checks before its warm-up: :func:`preflight`.

The warm-up takes seconds (a GPU's first kernels, longer); a setting that
would stop the server once warm is refused before it, in one line that names
the setting: a host without a token that is not loopback, a port taken or
not an address of this machine (the Flight port and ``--metrics-port``), a
``--metrics-port`` without prometheus-client, TLS files that are not a
certificate and its key. Each port is bound for a moment with the options
the server binds it with (``SO_REUSEADDR``) and released: a port another
process takes in between still fails at listen time. Thread-safe.
"""

from __future__ import annotations

import errno
import socket

from nexus_cache.errors import BackendUnavailableError, ConfigError
from nexus_cache.server.settings import ServerSettings

__all__ = ["preflight"]


def preflight(settings: ServerSettings) -> None:
    """Raise :class:`ConfigError` (or :class:`BackendUnavailableError` for a missing
    extra) for what would stop ``settings`` from serving; nothing is kept bound."""
    settings.check_exposure()
    if settings.metrics_port is not None:
        try:
            import prometheus_client  # noqa: F401
        except ImportError as exc:
            raise BackendUnavailableError(
                f"--metrics-port needs prometheus-client ({exc}); install nexus-cache[metrics] "
                "or leave --metrics-port out"
            ) from None
    if settings.tls_cert is not None and settings.tls_key is not None:
        _check_tls(settings)
    _check_port(settings.host, settings.port, "--port", settings.url)
    if settings.metrics_port is not None:
        if settings.metrics_port == settings.port and settings.port != 0:
            raise ConfigError(
                f"--metrics-port={settings.metrics_port} is --port as well; give it another port"
            )
        metrics_url = settings.url_with_port(settings.metrics_port).split("://", 1)[1]
        _check_port(
            settings.host, settings.metrics_port, "--metrics-port", f"http://{metrics_url}"
        )


def _check_port(host: str, port: int, option: str, url: str) -> None:
    """Bind ``host:port`` for a moment, as the server will; ConfigError if it cannot."""
    try:
        addresses = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise ConfigError(
            f"--host={host!r} cannot be resolved ({exc.strerror}); give an address of this "
            "machine (127.0.0.1, 0.0.0.0, ::1) or a name that resolves to one"
        ) from None
    problem: OSError | None = None
    bound = 0
    for family, kind, proto, _name, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise ConfigError(
                        f"cannot listen on {url}: {option}={port} is taken (another process "
                        f"listens there); stop it, or choose another {option}"
                    ) from None
                problem = exc
                continue
            bound += 1
    if not bound:
        reason = problem.strerror if problem is not None else "no address"
        raise ConfigError(
            f"cannot listen on {url} ({reason}); --host must be an address of this machine, "
            f"and {option} a port this user may bind (>= 1024 unless privileged)"
        )


def _check_tls(settings: ServerSettings) -> None:
    """The certificate and key load, and belong together."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(str(settings.tls_cert), str(settings.tls_key))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"--tls-cert={str(settings.tls_cert)!r} and --tls-key={str(settings.tls_key)!r} "
            f"cannot be used together ({getattr(exc, 'reason', None) or exc}); give a PEM "
            "certificate and the private key it was made with"
        ) from None
