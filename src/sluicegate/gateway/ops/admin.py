"""What guards the admin endpoints that change state, and the admin's view of every batch.

``POST /admin/drain``, ``POST /admin/undrain`` and ``POST /admin/batches/{id}/cancel``
take the admin key only as ``Authorization: Bearer`` and refuse what a browser sends
for another site (``check_admin_write``): a page elsewhere can make a browser post a
form, with the HTTP Basic credentials it cached for ``/dashboard``, but it can neither
set a bearer header nor hide where the request came from. The read-only endpoints
(``GET /admin/state``, ``GET /admin/batches``, ``/dashboard``) also take HTTP Basic.

Every answer under ``/admin`` and ``/dashboard`` carries ``Cache-Control: no-store``
(``no_store``, applied by ``GatewayApp``).
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Send

from sluicegate.batches.batch_backend import BatchBackend
from sluicegate.batches.objects import batch_object
from sluicegate.gateway.batch_lane.batch_api import _listing, _page
from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.request.auth import admin_bearer, admin_token
from sluicegate.gateway.state import GatewayState

SAME_ORIGIN_SITES = frozenset({"same-origin", "none"})
"""``Sec-Fetch-Site`` values a state-changing admin request may carry (``none``: typed
by the user, or sent by a tool); browsers set the header and pages cannot change it."""
NO_STORE_PREFIXES = ("/admin", "/dashboard")
DEFAULT_PORTS = {"http": "80", "https": "443"}


def no_store(send: Send) -> Send:
    """``send`` with ``Cache-Control: no-store`` added to the response head (unless the
    handler set a ``Cache-Control`` of its own)."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            if all(name.lower() != b"cache-control" for name, _ in headers):
                headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
        await send(message)

    return sending


def _authority(scheme: str, netloc: str) -> str:
    """``host[:port]`` in lower case, without the scheme's default port."""
    netloc = netloc.lower()
    default = DEFAULT_PORTS.get(scheme)
    if default is not None and netloc.endswith(f":{default}"):
        return netloc[: -len(default) - 1]
    return netloc


def refuse_cross_site(request: Request) -> None:
    """``GatewayError(403, "cross_site_request")`` for a request a browser sent for
    another site: ``Sec-Fetch-Site`` other than ``same-origin``/``none``, or an
    ``Origin`` that is not this gateway's (scheme and host of the ``Host`` it was sent
    to; ``null`` is never)."""
    headers = request.headers
    sites = headers.getlist("sec-fetch-site")
    if len(sites) > 1 or (sites and sites[0].strip().lower() not in SAME_ORIGIN_SITES):
        raise GatewayError(403, "cross_site_request", "admin actions are refused from another site")
    origins = headers.getlist("origin")
    if not origins:
        return
    host = headers.get("host", "")
    parts = urlsplit(origins[0].strip())
    own = _authority(parts.scheme, host) if host else None
    if (
        len(origins) > 1
        or parts.scheme not in DEFAULT_PORTS
        or own is None
        or _authority(parts.scheme, parts.netloc) != own
    ):
        raise GatewayError(
            403, "cross_site_request", "admin actions are refused from another origin"
        )


def _has_body(request: Request) -> bool:
    headers = request.headers
    if "transfer-encoding" in headers:
        return True
    length = headers.get("content-length", "0").strip()
    return not (length.isdigit() and int(length) == 0)


def check_admin_write(request: Request, state: GatewayState) -> str:
    """The admin key of a state-changing admin request, after its checks, in this order:
    not cross-site (403 ``cross_site_request``), the key as a bearer token (401
    ``invalid_admin_key``), a body only as JSON (415 ``unsupported_media_type``)."""
    refuse_cross_site(request)
    token = admin_bearer(request.headers)
    if token is None or not state.keys.is_admin(token):
        raise GatewayError(
            401,
            "invalid_admin_key",
            "this action needs the admin key as Authorization: Bearer (HTTP Basic is only "
            "for the read-only dashboard)",
        )
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if _has_body(request) and media != "application/json":
        raise GatewayError(
            415,
            "unsupported_media_type",
            "an admin action takes no body, or a JSON one (Content-Type: application/json)",
        )
    return token


def check_admin_read(request: Request, state: GatewayState) -> str:
    """The admin key of a read-only admin request: bearer or HTTP Basic (401 otherwise)."""
    token = admin_token(request.headers)
    if token is None or not state.keys.is_admin(token):
        raise GatewayError(401, "invalid_admin_key", "this endpoint needs the admin key")
    return token


def _json(data: object) -> Response:
    return Response(orjson.dumps(data), media_type="application/json")


class AdminBatches:
    """``GET /admin/batches`` and ``POST /admin/batches/{id}/cancel``: every tenant's
    batches, for the admin (``backend`` None: the batch lane is off, 404
    ``batches_disabled``)."""

    def __init__(self, state: GatewayState, backend: BatchBackend | None) -> None:
        self.state = state
        self.backend = backend

    def routes(self) -> list[Route]:
        """The two routes."""
        return [
            Route("/admin/batches", self.listing, methods=["GET"]),
            Route("/admin/batches/{batch_id}/cancel", self.cancel, methods=["POST"]),
        ]

    def _backend(self) -> BatchBackend:
        if self.backend is None:
            raise GatewayError(
                404, "batches_disabled", "the batch lane is off on this gateway (no batches:)"
            )
        return self.backend

    async def _object(self, row: dict[str, Any]) -> dict[str, Any]:
        counts = await self._backend().batch_counts(row["id"])
        return {**batch_object(row, counts), "tenant": row["tenant"]}

    async def listing(self, request: Request) -> Response:
        """Every tenant's batches newest first (``tenant`` narrows; ``after``, ``limit`` as
        in ``GET /v1/batches``), each with its ``tenant``."""
        check_admin_read(request, self.state)
        backend = self._backend()
        after, limit = _page(request)
        tenant = request.query_params.get("tenant")
        rows, more = await backend.admin_batches(tenant, after, limit)
        return _json(_listing([await self._object(row) for row in rows], more))

    async def cancel(self, request: Request) -> Response:
        """Cancel any tenant's batch (``cancelling`` until the runner ends it)."""
        check_admin_write(request, self.state)
        backend = self._backend()
        batch_id = request.path_params["batch_id"]
        route = await backend.batch_route(batch_id)
        row = None
        if route is not None:
            row = await backend.cancel_batch(route[0], batch_id, int(time.time()))
        if row is None:
            shown = batch_id if len(batch_id) <= 64 and batch_id.isascii() else "…"
            raise GatewayError(404, "not_found", f"no such batch: {shown!r}")
        return _json(await self._object(row))
