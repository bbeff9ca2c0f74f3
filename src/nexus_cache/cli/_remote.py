"""``--server URL``: run a command's query on a ``nexus-cache serve`` server.

``scan``, ``graph`` and ``device report`` take ``--server URL`` (default:
``NEXUS_SERVER_URL``; the token comes from ``NEXUS_SERVER_TOKEN``) and print
exactly what the in-process command prints. A server that cannot be reached,
or refuses the token, is a one-line error naming the URL (exit status 2).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nexus_cache.errors import CommandError

__all__ = ["absolute_sources", "add_server_option", "client_for", "server_url"]

ENV_SERVER_URL = "NEXUS_SERVER_URL"
ENV_SERVER_TOKEN = "NEXUS_SERVER_TOKEN"


def add_server_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default=None,
        metavar="URL",
        help="run on the nexus-cache server at URL, e.g. grpc://127.0.0.1:8815 "
        f"(default: {ENV_SERVER_URL}; token: {ENV_SERVER_TOKEN})",
    )


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
    url = getattr(args, "server", None) or os.environ.get(ENV_SERVER_URL, "").strip()
    return url or None


@contextmanager
def client_for(url: str) -> Iterator[Any]:
    """A client of ``url``; unreachable or refusing servers become one-line errors (exit 2)."""
    from nexus_cache.client import Client
    from nexus_cache.errors import ServerAuthError, ServerUnavailableError

    token = os.environ.get(ENV_SERVER_TOKEN, "").strip() or None
    client = Client(url, token=token)
    try:
        yield client
    except (ServerUnavailableError, ServerAuthError) as exc:
        raise CommandError(str(exc)) from exc
    finally:
        client.close()
