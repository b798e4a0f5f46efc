"""What both relays share: the endpoint they serve and the upstream deadlines from the config."""

from __future__ import annotations

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
