"""``nexus-cache serve``: run the query service as an Arrow Flight server.

One long-lived process owns the service and its caches (lakehouse, decoded
sources, resident graphs); ``scan``, ``graph`` and ``device report`` reach it
with ``--server URL``. Settings: the command line, the ``NEXUS_SERVER_*``
variables, the ``[server]`` table of the TOML file (see ``docs/server.md``).
What can be checked before the warm-up is (``nexus_cache.server.preflight``):
the ports, ``--metrics-port``'s extra, the TLS files, a token off loopback.
"""

from __future__ import annotations

import argparse
from typing import Any

from nexus_cache.cli._output import count_option

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the query service as an Arrow Flight server (caches stay warm across commands)",
        description=(
            "Serve queries over Arrow Flight from one long-lived query service, so its GPU "
            "caches outlive any one command and every client shares them. The service is "
            "configured as for every command (NEXUS_* variables, --config TOML). Stops "
            "gracefully on SIGTERM, Ctrl-C or the shutdown action (exit 0)."
        ),
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument(
        "--port",
        type=count_option("--port"),
        default=8815,
        help="port to listen on (default 8815; 0 picks a free one, named in the log)",
    )
    parser.add_argument(
        "--metrics-port",
        type=count_option("--metrics-port"),
        default=None,
        metavar="N",
        help="serve Prometheus text at http://HOST:N/metrics (needs nexus-cache[metrics])",
    )
    parser.add_argument(
        "--config", default=None, metavar="FILE", help="TOML file (default: NEXUS_SERVICE_CONFIG)"
    )
    parser.add_argument(
        "--token-file",
        default=None,
        metavar="F",
        help="require 'authorization: Bearer <token>' with the token in F "
        "(default: NEXUS_SERVER_TOKEN, else no token)",
    )
    parser.add_argument(
        "--tls-cert", default=None, metavar="C", help="PEM certificate: serve grpc+tls://"
    )
    parser.add_argument(
        "--tls-key", default=None, metavar="K", help="PEM private key of --tls-cert"
    )
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="allow a non-loopback --host without a token",
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from nexus_cache.server.lifecycle import run_server
    from nexus_cache.server.preflight import preflight
    from nexus_cache.server.settings import load_settings, read_token_file

    settings = load_settings(
        args.config,
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        token=None if args.token_file is None else read_token_file(args.token_file),
        tls_cert=None if args.tls_cert is None else Path(args.tls_cert),
        tls_key=None if args.tls_key is None else Path(args.tls_key),
        allow_unauthenticated=args.allow_unauthenticated or None,
    )
    # a taken port or a missing extra is refused now, not after seconds of warm-up
    preflight(settings)
    return run_server(settings, args.config)
