"""``--server URL``: run a command's query on a ``nexus-cache serve`` server.

``scan``, ``graph`` and ``device report`` take ``--server URL`` (default:
``NEXUS_SERVER_URL``; the token comes from ``NEXUS_SERVER_TOKEN``) and
``--tls-root-certs FILE`` (default: ``NEXUS_SERVER_TLS_ROOT_CERTS``; else the
system's roots), and print exactly what the in-process command prints. A
server that cannot be reached, refuses the token or fails the TLS handshake is
a one-line error naming the URL and what happened (exit status 2). gRPC's own
log lines stay off the terminal (``GRPC_VERBOSITY``, unless set, is ``NONE``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nexus_cache._env import read
from nexus_cache.errors import CommandError
from nexus_cache.server.settings import TLS_ROOT_CERTS_VARIABLE, TOKEN_VARIABLE, URL_VARIABLE

__all__ = ["absolute_sources", "add_server_option", "client_for", "quiet_grpc", "server_url"]

ENV_SERVER_URL = URL_VARIABLE.name
ENV_SERVER_TOKEN = TOKEN_VARIABLE.name
ENV_SERVER_TLS_ROOT_CERTS = TLS_ROOT_CERTS_VARIABLE.name


def add_server_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default=None,
        metavar="URL",
        help="run on the nexus-cache server at URL, e.g. grpc://127.0.0.1:8815 "
        f"(default: {ENV_SERVER_URL}; token: {ENV_SERVER_TOKEN})",
    )
    parser.add_argument(
        "--tls-root-certs",
        default=None,
        metavar="FILE",
        help="PEM file of the CA that signs a grpc+tls:// server's certificate "
        f"(default: {ENV_SERVER_TLS_ROOT_CERTS}, else the system's roots)",
    )


def quiet_grpc() -> None:
    """Keep gRPC's own log lines (``E0000 ... ssl_transport_security.cc``) off the
    terminal: the error that follows says what happened, in one line.
    ``GRPC_VERBOSITY`` set by the user wins. Must run before gRPC starts (the
    first Flight client or server of the process)."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")


def absolute_sources(query: Any) -> Any:
    """``query`` with a relative local source made absolute: the server runs elsewhere
    (another working directory), the user meant this shell's."""
    import dataclasses

    scan = getattr(query, "edges", query)
    source = scan.source
    if "://" in source or "::" in source or os.path.isabs(source):
        return query
    scan = dataclasses.replace(scan, source=os.path.abspath(os.path.expanduser(source)))
    if scan is query or not hasattr(query, "edges"):
        return scan
    return dataclasses.replace(query, edges=scan)


def server_url(args: argparse.Namespace) -> str | None:
    """``--server``, else ``NEXUS_SERVER_URL``, else None (run in this process)."""
    url: str | None = getattr(args, "server", None) or read(URL_VARIABLE)
    return url or None


@contextmanager
def client_for(url: str, args: argparse.Namespace | None = None) -> Iterator[Any]:
    """A client of ``url``; unreachable or refusing servers become one-line errors (exit 2).

    ``args.tls_root_certs`` (else ``NEXUS_SERVER_TLS_ROOT_CERTS``) names the
    CA file of a ``grpc+tls://`` server.
    """
    quiet_grpc()
    from nexus_cache.client import Client
    from nexus_cache.errors import ServerAuthError, ServerUnavailableError

    token = read(TOKEN_VARIABLE)
    roots = getattr(args, "tls_root_certs", None) or read(TLS_ROOT_CERTS_VARIABLE)
    client = Client(url, token=token, tls_root_certs=roots)
    try:
        yield client
    except (ServerUnavailableError, ServerAuthError) as exc:
        raise CommandError(str(exc)) from exc
    finally:
        client.close()
