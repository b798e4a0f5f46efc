"""What both relays share: the endpoint they serve, the upstream deadlines from the config,
and the body as the admitted backend's engine gets it."""

from __future__ import annotations

from sluicegate.gateway.request.engine_priority import with_priority, without_priority
from sluicegate.gateway.request.exchange import Exchange
from sluicegate.gateway.state import GatewayState
from sluicegate.gateway.streams.endpoint_kind import Endpoint


class Relay:
    """The base of ``UnaryRelay`` and ``StreamRelay``: ``endpoint`` at ``path`` upstream,
    with the first-byte and idle deadlines of ``config.server``."""

    def __init__(self, state: GatewayState, endpoint: Endpoint, path: str) -> None:
        self.state = state
        self.endpoint = endpoint
        self.path = path
        server = state.config.server
        self._first_byte_s = server.upstream_first_byte_timeout_s
        self._idle_s = server.upstream_idle_timeout_s

    def engine_body(self, exchange: Exchange, body: bytes) -> bytes:
        """``body`` as the admitted backend gets it: with the engine's priority field when
        the backend has ``priority_passthrough``, else without sluicegate's ``priority``
        (``engine_priority``)."""
        ticket, admit = exchange.ticket, exchange.admit
        assert admit is not None
        field = self.state.priority_field(ticket.model, admit.backend)
        if field is None:
            return without_priority(body)
        value = self.state.profile(ticket.model, admit.backend).priority_value(ticket.priority)
        return with_priority(body, field, value)
