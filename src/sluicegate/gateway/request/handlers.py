"""The OpenAI inference endpoints: authenticate, classify, submit, then hand over to a relay.

One request's life (DESIGN §4): the body is read under a size cap and parsed
once; the bearer key names the tenant; lane, priority and deadline are
classified into a ticket; the scheduler admits, queues or rejects it
(``admission_wait.py``); an admitted request is proxied to the chosen backend by
``relay_unary.py`` or ``relay_stream.py``; the ``Exchange`` ends the ticket
exactly once, whatever happens.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import zlib

from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from sluicegate.core.ticket import Ticket, TicketId
from sluicegate.gateway.edge_protocol import DISCONNECT_EXTENSION
from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.request.admission_wait import admission, submit
from sluicegate.gateway.request.asgi_send import abort_connection, send_error
from sluicegate.gateway.request.body import RequestHead, read_body
from sluicegate.gateway.request.classify import (
    Endpoint,
    check_choices,
    classify,
    estimate_prompt_tokens,
    parse_body,
)
from sluicegate.gateway.request.exchange import Exchange
from sluicegate.gateway.request.interrupts import watch_disconnect
from sluicegate.gateway.request.relay_stream import StreamRelay
from sluicegate.gateway.request.relay_unary import UnaryRelay
from sluicegate.gateway.state import GatewayState
from sluicegate.gateway.upstream.http1 import UpstreamError

PATHS: dict[Endpoint, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}
BATCH_TENANT = "sluicegate.batch_tenant"
"""The scope key naming the tenant of a batch line run in-process (``line_dispatch.py``)."""
log = logging.getLogger("sluicegate.gateway")
_ids = itertools.count(1)
# Ticket ids double as the upstream X-Request-Id: 32 hex digits, which parse as a UUID
# (llama-cpp-python refuses any other shape with an empty 400).
_PREFIX = f"{os.getpid() & 0xFFFFFFFF:08x}"


def _check_ended(exchange: Exchange) -> GatewayError | None:
    """Every path through a relay ends the exchange; one that did not is a bug, which must
    still not leak the ticket's slot (nor be blamed on the engine): the error to answer
    with then."""
    if exchange.outcome is not None:
        return None
    log.error("request %s was served without ending its ticket", exchange.ticket.id)
    return exchange.fault()


async def _answer(scope: Scope, send: Send, error: GatewayError) -> None:
    """Answer with ``error``, or cut the connection if the response had already started."""
    try:
        await send_error(send, error)
    except RuntimeError:
        await abort_connection(scope)


class InferenceHandler:
    """Serves one OpenAI inference endpoint through the scheduler, as a plain ASGI app."""

    def __init__(self, state: GatewayState, endpoint: Endpoint) -> None:
        self.state = state
        self.endpoint = endpoint
        path = PATHS[endpoint]
        self._unary = UnaryRelay(state, endpoint, path)
        self._stream = StreamRelay(state, endpoint, path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one request; every failure before the response starts is an OpenAI error,
        the gateway's own (a bug before the request had a ticket) a 500 ``internal_error``."""
        try:
            await self._handle(scope, receive, send)
        except GatewayError as exc:
            await send_error(send, exc)
        except Exception:
            log.exception("unexpected error while reading a request")
            error = GatewayError(500, "internal_error", "the gateway failed to serve the request")
            await _answer(scope, send, error)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        arrival = state.driver.now()
        head = RequestHead.of(scope)
        # A batch line run in-process names its tenant in the scope (no HTTP client can).
        tenant = scope.get(BATCH_TENANT) or state.tenant_of(head.authorization)
        try:
            raw = await read_body(head, receive, state.config.server.max_body_bytes)
        except ClientDisconnect:
            return
        ticket = self._ticket(head, tenant, raw, arrival)
        exchange = Exchange(scope, send, ticket, raw, state.driver, state.metrics)
        waiting = submit(exchange, state.driver)
        on_disconnect = scope.get("extensions", {}).get(DISCONNECT_EXTENSION)
        watcher: asyncio.Task[None] | None = None
        if on_disconnect is not None:
            on_disconnect(exchange.interrupts.disconnected)
        else:  # a server without the extension: a task waits for ``http.disconnect``
            watcher = asyncio.create_task(watch_disconnect(receive, exchange.interrupts))
        try:
            if await admission(exchange, waiting):
                relay = self._stream if ticket.streaming else self._unary
                await relay.serve(exchange)
        except GatewayError:
            _check_ended(exchange)
            raise
        except UpstreamError:
            # An engine's failure that no path mapped: still the engine's.
            await self._unexpected(exchange, engine=True)
        except Exception:
            await self._unexpected(exchange, engine=False)
        else:
            error = _check_ended(exchange)
            if error is not None:
                await _answer(scope, send, error)
        finally:
            if watcher is not None:
                watcher.cancel()
            else:
                on_disconnect(None)
            exchange.interrupts.close()

    def _ticket(self, head: RequestHead, tenant: str, raw: bytes, arrival: float) -> Ticket:
        """The scheduler's ticket for a request: parse, classify, estimate."""
        state = self.state
        parsed = parse_body(raw, self.endpoint)
        model = state.models.get(parsed.model)
        if model is None:
            raise GatewayError(404, "model_not_found", f"model {parsed.model!r} does not exist")
        kind = classify(
            model,
            state.tenant_spec(tenant),
            lane_header=head.lane,
            priority_header=head.priority,
            deadline_header=head.deadline_ms,
            body_priority=parsed.priority,
        )
        units = 1 if self.endpoint == "embeddings" else parsed.n
        if units > 1:
            check_choices(model, units)
        server = state.config.server
        max_tokens = (
            1 if self.endpoint == "embeddings" else (parsed.max_tokens or server.default_max_tokens)
        )
        return Ticket(
            id=TicketId(f"{_PREFIX}{next(_ids):024x}"),
            model=model.name,
            tenant=tenant,
            lane=kind.lane,
            priority=kind.priority,
            prompt_tokens=estimate_prompt_tokens(parsed, server.chars_per_token),
            max_tokens=max_tokens * units,
            arrival=arrival,
            deadline=None if kind.deadline_ms is None else arrival + kind.deadline_ms / 1000.0,
            prefix_key=zlib.crc32(parsed.prefix.encode()) if parsed.prefix else None,
            streaming=parsed.stream,
            units=units,
        )

    async def _unexpected(self, exchange: Exchange, *, engine: bool) -> None:
        """A bug (``engine=False``: 500 ``internal_error``, which tells the circuit and the
        limits nothing) or an engine failure nothing above foresaw (502
        ``upstream_error``): end the ticket (once), tell the client."""
        log.exception("unexpected error while serving request %s", exchange.ticket.id)
        if engine:
            error = exchange.fail(
                GatewayError(502, "upstream_error", "the gateway could not relay the answer")
            )
        else:
            error = exchange.fault()
        await _answer(exchange.scope, exchange.send, error)
