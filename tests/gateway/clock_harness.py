"""A gateway on an ``OffsetClock``: real HTTP and real engines, scheduling time a test advances.

Circuit cool-downs, queue timeouts and other scheduling waits pass at
``clock.advance(seconds)`` instead of a real sleep; network deadlines and the
engines keep real time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from sluicegate.gateway.app import build_app
from sluicegate.gateway.clock import OffsetClock
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    Stack,
    gateway_config,
    start_server,
    stop_servers,
)


@contextmanager
def clocked_gateway(
    engine_ports: Sequence[int],
    body: str = "",
    *,
    scrape: bool = True,
    environ: Mapping[str, str] | None = None,
) -> Iterator[tuple[Stack, OffsetClock]]:
    """A gateway in front of ``engine_ports`` (as ``gateway_at`` builds it), and its clock."""
    clock = OffsetClock()
    config = gateway_config(engine_ports, body)
    env = {"SLUICEGATE_ADMIN_KEY": ADMIN_KEY, **(environ or {})}
    app = build_app(config, environ=env, scrape=scrape, clock=clock)
    running = start_server(app)
    try:
        yield Stack(running.port, tuple(engine_ports), config), clock
    finally:
        stop_servers([running])
