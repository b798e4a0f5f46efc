"""The OpenAI inference endpoints over HTTP: authenticate, read the body, serve it, and
answer what serving owes.

One request's life (DESIGN §4): the bearer key names the tenant; the body is read
under a size cap; ``Serving.serve_ticket`` (``serving.py``) classifies, submits,
waits for and relays it, writing every answer through an ``HttpSink``
(``asgi_send.py``) straight to ASGI ``send``. Every ``GatewayError`` of the inference
path, raised here before serving or owed in serving's outcome, is rendered in one
place: ``_answer``, with ``GatewayError.response`` (``gateway/http_errors.py``).
"""

from __future__ import annotations

import logging

from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from sluicegate.gateway.http_errors import GatewayError, error_response
from sluicegate.gateway.request.asgi_send import HttpSink
from sluicegate.gateway.request.body import RequestHead, read_body
from sluicegate.gateway.request.serving import Serving, TicketRequest, owed_error
from sluicegate.gateway.state import GatewayState
from sluicegate.gateway.streams.endpoint_kind import PATHS, Endpoint

log = logging.getLogger("sluicegate.gateway")


async def _answer(
    scope: Scope, receive: Receive, send: Send, sink: HttpSink, error: GatewayError
) -> None:
    """Answer with ``error`` in OpenAI's shape (retry headers on 429 and 503), or cut the
    connection if the response had already started."""
    if sink.started:
        await sink.abort()
        return
    await error_response(error)(scope, receive, send)


class InferenceHandler:
    """Serves one OpenAI inference endpoint through the scheduler, as a plain ASGI app.

    ``serving`` is the endpoint's seam below HTTP, which the batch runner calls too.
    """

    def __init__(self, state: GatewayState, endpoint: Endpoint) -> None:
        self.state = state
        self.serving = Serving(state, endpoint, PATHS[endpoint])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one request; every failure before the response starts is an OpenAI error,
        the gateway's own (a bug before the request had a ticket) a 500 ``internal_error``."""
        sink = HttpSink(scope, receive, send)
        try:
            error = await self._handle(scope, receive, sink)
        except GatewayError as exc:
            error = exc
        except Exception:
            log.exception("unexpected error while reading a request")
            error = GatewayError(500, "internal_error", "the gateway failed to serve the request")
        if error is not None:
            await _answer(scope, receive, send, sink, error)

    async def _handle(self, scope: Scope, receive: Receive, sink: HttpSink) -> GatewayError | None:
        """Authenticate, read and serve the request; the error still owed, if any."""
        state = self.state
        arrival = state.driver.now()
        head = RequestHead.of(scope)
        tenant = state.tenant_of(head.authorization)
        try:
            raw = await read_body(head, receive, state.config.server.max_body_bytes)
        except ClientDisconnect:
            return None
        request = TicketRequest(tenant, arrival, head.lane, head.priority, head.deadline_ms)
        return owed_error(await self.serving.serve_ticket(request, raw, sink))
