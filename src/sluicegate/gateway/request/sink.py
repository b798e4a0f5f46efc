"""Where a served request's answer goes: the ``Sink`` a caller of ``serve_ticket`` hands in.

The relays (``relay_unary.py``, ``relay_stream.py``) answer through it, via the
``Exchange``: a whole answer as a typed ``Reply``, or an event stream piece by piece.
The HTTP handler's sink writes to ASGI ``send`` (``asgi_send.HttpSink``); a batch
line's keeps nothing, since its answer comes back in the outcome
(``batch_lane/line_dispatch.py``). A sink also says when its client leaves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True)
class Reply:
    """A whole answer, and what the gateway says beside it."""

    status: int
    body: bytes
    queued_s: float
    """How long the ticket waited for admission."""
    lane: str
    events: bool = False
    """The body is an event stream (a stream preempted before it started)."""
    preempted: bool = False
    """The text so far of a preempted request (``finish_reason: "preempted"``)."""
    retry_after_s: float | None = None
    """The engine's own 429: when the client may try again."""


class Sink(Protocol):
    """The client's end of one request being served."""

    def listen(self, gone: Callable[[], None] | None, /) -> None:
        """Call ``gone`` when the client leaves (at once if it already has); ``None``: stop."""

    async def answer(self, reply: Reply, /) -> None:
        """A whole answer."""

    async def open_stream(self, queued_s: float, lane: str, /) -> None:
        """Start a 200 event stream (its ticket waited ``queued_s`` in ``lane``)."""

    async def stream(self, data: bytes, /) -> None:
        """Whole events of a started stream."""

    async def end_stream(self, tail: bytes, /) -> None:
        """The last bytes of a started stream."""

    async def abort(self) -> None:
        """Drop the client without finishing its answer (it stopped reading)."""
