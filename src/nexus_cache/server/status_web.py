"""The status page's HTTP routes on the metrics port (``/metrics`` stays in ``metrics``).

* ``GET /``: the page (``static/status.html``; its script and style are
  ``/static/status.js`` and ``/static/status.css``, shipped in the package:
  no CDN, works offline);
* ``GET /api/status``: the JSON the page polls (:func:`~nexus_cache.server.status.build_status`);
* ``POST /api/cancel/<run id>``: cancels a running query, as its client's
  disconnect would;
* ``POST /login``: with a token, a form posting ``token=...`` sets a session
  cookie (HttpOnly, SameSite=Strict) for the browser.

With a server token, every route here needs ``Authorization: Bearer <token>``
or the session cookie (a random secret of this process, never the token);
``GET /`` without either answers the login form (401). A token is never
accepted in a URL. A POST carrying the cookie must come from the page's own
origin (``Origin`` or ``Sec-Fetch-Site``). Every answer forbids inline
scripts (Content-Security-Policy) and framing.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import secrets
from collections.abc import Callable
from http.cookies import CookieError, SimpleCookie
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from nexus_cache.server.auth import bearer_matches
from nexus_cache.server.metrics import ServerMetrics
from nexus_cache.server.querylog import QueryBoard
from nexus_cache.server.status import HitRateHistory, build_status

__all__ = ["SESSION_COOKIE", "StatusPages", "status_pages"]

log = logging.getLogger("nexus_cache.server")

#: the session cookie's name
SESSION_COOKIE = "nexus_session"
_STATIC = {
    "/static/status.js": ("status.js", "text/javascript; charset=utf-8"),
    "/static/status.css": ("status.css", "text/css; charset=utf-8"),
}
_HTML = "text/html; charset=utf-8"
_MAX_FORM_BYTES = 4096
_CANCEL = re.compile(r"/api/cancel/([0-9A-Za-z_-]{1,64})")
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def status_pages(
    service: Any, server: Any, metrics: ServerMetrics, board: QueryBoard, token: str | None
) -> StatusPages:
    """The status routes of ``server`` (a ``QueryFlightServer``) over ``service``."""
    history = HitRateHistory(metrics.counts)
    return StatusPages(
        lambda: build_status(service, metrics, board, history, server.health()),
        board.cancel,
        token,
    )


def _asset(name: str) -> bytes:
    return (resources.files("nexus_cache.server") / "static" / name).read_bytes()


class StatusPages:
    """Answers the status routes of a ``BaseHTTPRequestHandler``. Thread-safe.

    ``status()`` returns the ``/api/status`` document; ``cancel(run_id)``
    cancels a running query (False: none runs under that id); ``token`` is the
    server's token, or None (no authentication, as the Flight port).
    """

    def __init__(
        self,
        status: Callable[[], dict[str, Any]],
        cancel: Callable[[str], bool],
        token: str | None,
    ) -> None:
        self._status = status
        self._cancel = cancel
        self._token = token
        self._session = secrets.token_urlsafe(32)

    # -- routes ------------------------------------------------------------------------

    def get(self, handler: Any) -> None:
        path = handler.path.split("?", 1)[0]
        if path in _STATIC:
            name, kind = _STATIC[path]
            self._send(handler, 200, _asset(name), kind)
        elif path in ("/", "/index.html"):
            if self._allowed(handler):
                self._send(handler, 200, _asset("status.html"), _HTML)
            else:
                self._send(handler, 401, _asset("login.html"), _HTML)
        elif path == "/api/status":
            if not self._allowed(handler):
                self._json(handler, 401, {"error": self._refusal()})
                return
            try:
                body = json.dumps(self._status(), default=str, allow_nan=False)
            except Exception as exc:  # a cache closing under a shutdown, say
                log.info("status not assembled: %s: %s", type(exc).__name__, exc)
                self._json(handler, 503, {"error": "the status could not be read; retry"})
                return
            self._send(handler, 200, body.encode(), "application/json")
        else:
            self._json(handler, 404, {"error": f"{path} is not served here; open /"})

    def post(self, handler: Any) -> None:
        path = handler.path.split("?", 1)[0]
        if path == "/login":
            self._login(handler)
            return
        match = _CANCEL.fullmatch(path)
        if match is None:
            self._json(handler, 404, {"error": f"{path} is not served here"})
        elif not self._allowed(handler):
            self._json(handler, 401, {"error": self._refusal()})
        elif not self._same_origin(handler):
            self._json(handler, 403, {"error": "a cancel must come from the status page itself"})
        elif self._cancel(match.group(1)):
            self._json(handler, 200, {"cancelled": match.group(1)})
        else:
            self._json(handler, 404, {"error": f"no running query has id {match.group(1)}"})

    # -- authentication ----------------------------------------------------------------

    def _allowed(self, handler: Any) -> bool:
        if self._token is None:
            return True
        if bearer_matches(handler.headers.get("Authorization"), self._token):
            return True
        return hmac.compare_digest(self._cookie(handler).encode(), self._session.encode())

    def _same_origin(self, handler: Any) -> bool:
        """Not a cross-site request: ``Sec-Fetch-Site`` and ``Origin``, where sent,
        name this page; a request that holds only the cookie must send one of them
        (a client sending the token in its header needs neither)."""
        site = handler.headers.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            return False
        origin = handler.headers.get("Origin")
        host = handler.headers.get("Host", "")
        if origin is not None and origin not in (f"http://{host}", f"https://{host}"):
            return False
        if origin is not None or site is not None or self._token is None:
            return True
        return bearer_matches(handler.headers.get("Authorization"), self._token)

    def _cookie(self, handler: Any) -> str:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(handler.headers.get("Cookie", ""))
        except CookieError:
            return ""
        morsel = jar.get(SESSION_COOKIE)
        return morsel.value if morsel is not None else ""

    def _refusal(self) -> str:
        return (
            "this nexus-cache server needs its token: send 'Authorization: Bearer <token>' "
            "or log in at / (the token is never accepted in a URL)"
        )

    def _login(self, handler: Any) -> None:
        if self._token is None:
            self._redirect(handler, None)
            return
        if not self._same_origin(handler):
            self._json(handler, 403, {"error": "log in from the status page itself"})
            return
        try:
            length = int(handler.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 <= length <= _MAX_FORM_BYTES:
            self._json(handler, 413, {"error": f"a login form is at most {_MAX_FORM_BYTES} B"})
            return
        form = parse_qs(handler.rfile.read(length).decode("utf-8", "replace"))
        given = (form.get("token") or [""])[0].strip()
        if bearer_matches(f"Bearer {given}", self._token):
            self._redirect(handler, self._session)
        else:
            self._send(handler, 401, _asset("login.html"), _HTML)

    # -- answers -----------------------------------------------------------------------

    def _redirect(self, handler: Any, session: str | None) -> None:
        handler.send_response(303)
        handler.send_header("Location", "/")
        if session is not None:
            handler.send_header(
                "Set-Cookie",
                f"{SESSION_COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/",
            )
        for name, value in _HEADERS.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def _json(self, handler: Any, code: int, body: dict[str, Any]) -> None:
        self._send(handler, code, json.dumps(body).encode(), "application/json")

    @staticmethod
    def _send(handler: Any, code: int, body: bytes, kind: str) -> None:
        handler.send_response(code)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(body)))
        for name, value in _HEADERS.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(body)
