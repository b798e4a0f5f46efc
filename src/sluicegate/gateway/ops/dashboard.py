"""``GET /dashboard``: a live page of queues, limits, rates, tenants and backends.

The page is three static files shipped as package data (``gateway/ops/dashboard/``):
plain HTML, CSS and JavaScript with no build step and nothing fetched from
outside the gateway, so it works air-gapped. Its script polls ``/admin/state``
every 1.5 s and draws everything client-side.

Both the page and its assets need the admin key, as ``Authorization: Bearer KEY``
or HTTP Basic with the key as the password (any user name). A request without it
gets 401 with ``WWW-Authenticate: Basic realm="sluicegate"``, so a browser asks for
the key and then re-sends it with the page's own requests. With
``server.dashboard: false`` every dashboard path answers 404.
"""

from __future__ import annotations

import functools
import importlib.resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.request.auth import admin_token
from sluicegate.gateway.state import GatewayState

REALM_CHALLENGE = 'Basic realm="sluicegate", charset="UTF-8"'

ASSETS: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "view.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
"""Every file the dashboard serves, with its content type; nothing else is reachable."""

SECURITY_HEADERS: dict[str, str] = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; font-src 'none'; object-src 'none'; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
"""Headers on every dashboard answer, errors included."""


@functools.cache
def asset(name: str) -> bytes:
    """The bytes of dashboard file ``name`` (one of ``ASSETS``), read once from package data."""
    if name not in ASSETS:
        raise KeyError(name)
    files = importlib.resources.files(__package__).joinpath("dashboard")
    return files.joinpath(name).read_bytes()


class Dashboard:
    """The ``/dashboard`` routes of one gateway: ``Dashboard(state).routes()``."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self.enabled = state.config.server.dashboard
        if self.enabled:
            for name in ASSETS:
                asset(name)  # read at start-up: a wheel missing its package data fails here

    def routes(self) -> list[Route]:
        """The page at ``/dashboard`` and its assets at ``/dashboard/<file>``."""
        return [
            Route("/dashboard", self.page, methods=["GET"]),
            Route("/dashboard/{name}", self.file, methods=["GET"]),
        ]

    async def page(self, request: Request) -> Response:
        """The dashboard's HTML page."""
        return self._serve(request, "index.html")

    async def file(self, request: Request) -> Response:
        """One of the page's assets (``app.js``, ``style.css``, ...)."""
        return self._serve(request, request.path_params["name"])

    def _serve(self, request: Request, name: str) -> Response:
        if not self.enabled:
            raise _error(404, "not_found", "the dashboard is disabled (server.dashboard)")
        key = admin_token(request.headers)
        if key is None or not self.state.keys.is_admin(key):
            challenge = {"WWW-Authenticate": REALM_CHALLENGE}
            raise _error(401, "invalid_admin_key", "the dashboard needs the admin key", challenge)
        if name not in ASSETS:
            raise _error(404, "not_found", "no such dashboard file")
        return Response(asset(name), media_type=ASSETS[name], headers=SECURITY_HEADERS)


def _error(
    status: int, code: str, message: str, extra: dict[str, str] | None = None
) -> GatewayError:
    return GatewayError(status, code, message, headers={**SECURITY_HEADERS, **(extra or {})})
