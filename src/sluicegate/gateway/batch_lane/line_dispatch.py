"""Running one batch line through the gateway's own serving path, in-process.

A line is served by its endpoint's ``Serving.serve_ticket`` (``gateway/request/serving.py``),
the function the HTTP handler calls once it has read a request: as a ticket of its
batch's tenant, in its batch's lane, at ``batches.priority``, it is classified,
rate-limited, queued, admitted, routed, preempted and accounted exactly as an HTTP
request of that tenant would be, without a socket or a request made up for it. Its
answer comes back in the typed outcome, so the line's ``Sink`` keeps nothing; it only
says when the line's client leaves: ``LineCall.stop`` takes a waiting ticket out of
its queue and stops a running one's engine.
"""

from __future__ import annotations

from collections.abc import Callable

from sluicegate.gateway.request.serving import Served, Serving, TicketRequest
from sluicegate.gateway.request.sink import Reply


class LineCall:
    """One line being served (``run`` once, ``stop`` at any time), and the ``Sink`` of its
    request."""

    __slots__ = ("_gone", "request_id", "stopped")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        """The id its output line names."""
        self.stopped = False
        self._gone: Callable[[], None] | None = None

    async def run(self, serving: Serving, request: TicketRequest, body: bytes) -> Served | None:
        """Serve the line's ``body`` as ``request`` asks; how it went, or None if it was
        stopped meanwhile (what came back then is moot)."""
        served = await serving.serve_ticket(request, body, self)
        return None if self.stopped else served

    def stop(self) -> None:
        """The line's client leaves: a waiting ticket leaves its queue, a running one ends."""
        if self.stopped:
            return
        self.stopped = True
        if self._gone is not None:
            self._gone()

    def listen(self, gone: Callable[[], None] | None, /) -> None:
        """Call ``gone`` when the line is stopped (at once if it already was)."""
        if gone is not None and self.stopped:
            gone()
            return
        self._gone = gone

    async def answer(self, reply: Reply, /) -> None:
        """Nothing to write: the outcome carries the answer."""

    async def open_stream(self, queued_s: float, lane: str, /) -> None:
        """Never called: a line cannot stream (``batches/lines.py`` refuses ``stream``)."""

    async def stream(self, data: bytes, /) -> None:
        """Never called (no stream)."""

    async def end_stream(self, tail: bytes, /) -> None:
        """Never called (no stream)."""

    async def abort(self) -> None:
        """Nothing to cut: the line has no connection."""
