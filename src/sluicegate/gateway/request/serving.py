"""Serving one ticket, whoever asked: the seam below HTTP.

``Serving.serve_ticket(request, body, sink)`` is a request's life once its tenant is
known and its body read (DESIGN §4): parse and classify the body into a ticket, submit
it, wait for the scheduler's verdict (``admission_wait.py``), relay the admitted
request (``relay_unary.py``, ``relay_stream.py``) through ``sink``, end the ticket
exactly once (``Exchange``), and say how it went as a typed ``Served``. Two callers:
the HTTP handler (``handlers.py``: an ``HttpSink`` writes to ASGI ``send``) and the
batch runner (``batch_lane/line_runner.py``: a line's sink keeps nothing, the
outcome carries the answer).

Nothing here renders a ``GatewayError``: a refusal or a failure comes back in the
outcome (``owed_error``), and the caller answers it at its own boundary.

The request and outcome records are plain slotted dataclasses, not frozen ones: one of
each is made per request, and a frozen one costs several times as much to make.
"""

from __future__ import annotations

import itertools
import logging
import os
import zlib
from dataclasses import dataclass

from sluicegate.core.ticket import Outcome, Ticket, TicketId
from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.request.admission_wait import admission, submit
from sluicegate.gateway.request.classify import (
    check_choices,
    classify,
    estimate_prompt_tokens,
    parse_body,
    prompt_block_hashes,
)
from sluicegate.gateway.request.exchange import Exchange
from sluicegate.gateway.request.relay_stream import StreamRelay
from sluicegate.gateway.request.relay_unary import UnaryRelay
from sluicegate.gateway.request.sink import Sink
from sluicegate.gateway.state import GatewayState
from sluicegate.gateway.streams.endpoint_kind import Endpoint
from sluicegate.gateway.upstream.http1 import UpstreamError

log = logging.getLogger("sluicegate.gateway")
_ids = itertools.count(1)
# Ticket ids double as the upstream X-Request-Id: 32 hex digits, which parse as a UUID
# (llama-cpp-python refuses any other shape with an empty 400).
_PREFIX = f"{os.getpid() & 0xFFFFFFFF:08x}"


@dataclass(slots=True)
class TicketRequest:
    """Who asks, since when, and what of scheduling, besides the body: the ``tenant``, the
    ``arrival`` (on the scheduling clock), and the ``lane``, ``priority`` and
    ``deadline_ms`` asked for, spelled as the ``X-Sluicegate-*`` headers spell them
    (``None``: not asked). ``classify`` checks them as it checks the headers."""

    tenant: str
    arrival: float
    lane: str | None = None
    priority: str | None = None
    deadline_ms: str | None = None


@dataclass(slots=True)
class Completed:
    """The engine's answer, relayed whole: a success (``ok``, 2xx), or the engine's own
    refusal of the request in OpenAI's error shape (4xx; 501 for a feature it was not
    started with, the one 5xx relayed as it is)."""

    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        """Whether the engine served the request (2xx)."""
        return 200 <= self.status < 300

    @property
    def transient(self) -> bool:
        """Whether another attempt may fare better (a 5xx)."""
        return self.status >= 500


@dataclass(slots=True)
class Rejected:
    """Refused for now: by the scheduler (rate limit, full queue, queue timeout, draining,
    no healthy backend …; its ``error`` is owed to the client) or by the engine's own 429
    (``error`` None: relayed as the engine sent it). The same request may be served after
    ``retry_after_s``."""

    retry_after_s: float
    error: GatewayError | None = None


@dataclass(slots=True)
class Preempted:
    """Preempted by more important work: ``body`` is the answer so far
    (``finish_reason: "preempted"``), already sent."""

    body: bytes


@dataclass(slots=True)
class Failed:
    """Not served, for the gateway's own ``error`` (owed to the client): the request's fault
    (4xx: malformed, unknown model, lane not allowed …) or a failure of the engine or of
    the gateway (5xx: ``transient``)."""

    error: GatewayError

    @property
    def transient(self) -> bool:
        """Whether another attempt may fare better (a 5xx)."""
        return self.error.status >= 500


@dataclass(slots=True)
class Streamed:
    """An event stream went out; ``outcome`` says how it ended (whatever the end, the
    stream itself carried it)."""

    outcome: Outcome


@dataclass(slots=True)
class Left:
    """The client left (or the scheduler dropped the ticket) before an answer: nothing
    was answered."""


Served = Completed | Rejected | Preempted | Failed | Streamed | Left
"""How serving one ticket went."""


def owed_error(served: Served) -> GatewayError | None:
    """The gateway's error the caller still owes its client: a refusal or a failure."""
    if isinstance(served, (Failed, Rejected)):
        return served.error
    return None


def _internal_error() -> GatewayError:
    return GatewayError(500, "internal_error", "the gateway failed to serve the request")


def _check_ended(exchange: Exchange) -> GatewayError | None:
    """Every path through a relay ends the exchange; one that did not is a bug, which must
    still not leak the ticket's slot (nor be blamed on the engine): the error to answer
    with then."""
    if exchange.outcome is not None:
        return None
    log.error("request %s was served without ending its ticket", exchange.ticket.id)
    return exchange.fault()


def _raised(exchange: Exchange, error: GatewayError) -> Served:
    """What a ``GatewayError`` out of serving means: the scheduler's refusal, or a failure."""
    _check_ended(exchange)
    if exchange.refused and error.retry_after_s is not None:
        return Rejected(error.retry_after_s, error)
    return Failed(error)


def _answered(exchange: Exchange) -> Served:
    """How an exchange that ended (without raising) went, from what it answered."""
    reply = exchange.answered
    if reply is not None:
        if reply.preempted:
            return Preempted(reply.body)
        if reply.retry_after_s is not None:
            return Rejected(reply.retry_after_s)
        return Completed(reply.status, reply.body)
    if exchange.streamed:
        assert exchange.outcome is not None
        return Streamed(exchange.outcome)
    return Left()


class Serving:
    """Serves the tickets of one endpoint, for the HTTP handler and the batch runner alike."""

    def __init__(self, state: GatewayState, endpoint: Endpoint, path: str) -> None:
        self.state = state
        self.endpoint = endpoint
        self._unary = UnaryRelay(state, endpoint, path)
        self._stream = StreamRelay(state, endpoint, path)

    async def serve_ticket(self, request: TicketRequest, body: bytes, sink: Sink) -> Served:
        """Serve ``body`` as ``request`` asks, answering through ``sink``; how it went.

        Raises nothing a request can cause: a refusal or a failure is returned, its error
        unrendered. A bug is logged and is a ``Failed`` 500 ``internal_error`` that blames
        no engine; an engine failure nothing foresaw is a 502 ``upstream_error``.
        """
        state = self.state
        try:
            ticket = self._ticket(request, body)
        except GatewayError as exc:
            return Failed(exc)
        except Exception:
            log.exception("unexpected error while classifying a request")
            return Failed(_internal_error())
        exchange = Exchange(sink, ticket, body, state.driver, state.metrics)
        try:
            waiting = submit(exchange, state.driver)
        except GatewayError as exc:
            return _raised(exchange, exc)
        sink.listen(exchange.interrupts.disconnected)
        try:
            if await admission(exchange, waiting):
                relay = self._stream if ticket.streaming else self._unary
                await relay.serve(exchange)
        except GatewayError as exc:
            return _raised(exchange, exc)
        except UpstreamError:
            # An engine's failure that no path mapped: still the engine's.
            return Failed(self._unexpected(exchange, engine=True))
        except Exception:
            return Failed(self._unexpected(exchange, engine=False))
        finally:
            sink.listen(None)
            exchange.interrupts.close()
        error = _check_ended(exchange)
        return _answered(exchange) if error is None else Failed(error)

    def _ticket(self, request: TicketRequest, raw: bytes) -> Ticket:
        """The scheduler's ticket for a request: parse, classify, estimate."""
        state = self.state
        parsed = parse_body(raw, self.endpoint)
        model = state.models.get(parsed.model)
        if model is None:
            raise GatewayError(404, "model_not_found", f"model {parsed.model!r} does not exist")
        kind = classify(
            model,
            state.tenant_spec(request.tenant),
            lane_header=request.lane,
            priority_header=request.priority,
            deadline_header=request.deadline_ms,
            body_priority=parsed.priority,
        )
        server = state.config.server
        if self.endpoint == "embeddings":
            units, max_tokens = 1, 1
        else:
            units, max_tokens = parsed.n, parsed.max_tokens or server.default_max_tokens
        if units > 1:
            check_choices(model, units)
        arrival = request.arrival
        return Ticket(
            id=TicketId(f"{_PREFIX}{next(_ids):024x}"),
            model=model.name,
            tenant=request.tenant,
            lane=kind.lane,
            priority=kind.priority,
            prompt_tokens=estimate_prompt_tokens(parsed, server.chars_per_token),
            max_tokens=max_tokens * units,
            arrival=arrival,
            deadline=None if kind.deadline_ms is None else arrival + kind.deadline_ms / 1000.0,
            prefix_key=zlib.crc32(parsed.prefix.encode()) if parsed.prefix else None,
            block_hashes=prompt_block_hashes(parsed, model),
            streaming=parsed.stream,
            units=units,
        )

    def _unexpected(self, exchange: Exchange, *, engine: bool) -> GatewayError:
        """A bug (``engine=False``: 500 ``internal_error``, which tells the circuit and the
        limits nothing) or an engine failure nothing above foresaw (502
        ``upstream_error``): end the ticket (once); the error owed to the client."""
        log.exception("unexpected error while serving request %s", exchange.ticket.id)
        if engine:
            return exchange.fail(
                GatewayError(502, "upstream_error", "the gateway could not relay the answer")
            )
        return exchange.fault()
