"""Serving a streamed request: relay the engine's events as they arrive, account for them,
and end the stream exactly once, well-formed whatever happened.

Only whole events are forwarded (``SseSplitter``), so the gateway's own last
event (an error, or a preempted request's closing chunk) never lands inside
one of the engine's. The same events are scanned on the side (``SseScanner``)
for the chunk count (reported as progress, which gates preemption), ``usage``,
the time to first token and error events.
"""

from __future__ import annotations

from typing import NamedTuple

from sluicegate.core.ticket import Feedback, Outcome, Usage
from sluicegate.engine_profiles import EngineProfile
from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.request.admission_wait import admission
from sluicegate.gateway.request.exchange import Exchange
from sluicegate.gateway.request.interrupts import Interrupt, WaitInterruptedError
from sluicegate.gateway.request.relay import Relay
from sluicegate.gateway.request.replies import error_event, preempted_chunk, relay_answer
from sluicegate.gateway.request.stream_errors import openai_error_events
from sluicegate.gateway.state import GatewayState
from sluicegate.gateway.streams.endpoint_kind import Endpoint
from sluicegate.gateway.streams.scanner import SseScanner
from sluicegate.gateway.streams.sse import EVENT_TOO_LARGE, SseSplitter
from sluicegate.gateway.upstream.clients import NotReachedError
from sluicegate.gateway.upstream.http1 import Http1Response, UpstreamError, UpstreamProtocolError


class _Ending(NamedTuple):
    """How a started stream ended: the outcome, whether the engine did its part (``ok``),
    and the last bytes the client gets."""

    outcome: Outcome
    ok: bool
    tail: bytes


_CANCELLED = _Ending(Outcome.CANCELLED, True, b"")
_MALFORMED = _Ending(
    Outcome.UPSTREAM_ERROR,
    False,
    error_event("upstream_error", "the engine sent a malformed event"),
)
_CUT_OFF = _Ending(
    Outcome.UPSTREAM_ERROR, False, error_event("upstream_error", "the engine's stream was cut off")
)
_EVENT_TOO_LARGE = _Ending(
    Outcome.UPSTREAM_ERROR, False, error_event("upstream_event_too_large", EVENT_TOO_LARGE)
)
_SILENT = _Ending(
    Outcome.UPSTREAM_ERROR,
    False,
    error_event("upstream_timeout", "the engine's stream went silent"),
)
_ENDED_EARLY = _Ending(
    Outcome.UPSTREAM_ERROR,
    False,
    error_event("upstream_error", "the engine ended the stream early"),
)
# llama.cpp's answer to a prompt longer than its context: a request problem, not an engine
# failure, so the circuit is left alone.
_EMPTY = _Ending(
    Outcome.UPSTREAM_ERROR,
    True,
    error_event(
        "empty_stream",
        "the engine returned an empty stream (is the prompt longer than its context?)",
    ),
)


class _Progress:
    """What the relay has seen of the engine's stream so far."""

    __slots__ = ("received", "scanner", "splitter", "ttft_s")

    def __init__(self) -> None:
        self.splitter = SseSplitter()
        self.scanner = SseScanner()
        self.received = 0
        self.ttft_s: float | None = None  # from arrival

    def usage(self, exchange: Exchange, ending: _Ending) -> Usage:
        """The usage to complete the ticket with: the engine's ``usage`` if it sent one,
        else the estimate and the chunks counted."""
        scanner, admit = self.scanner, exchange.admit
        assert admit is not None
        if ending.outcome is Outcome.COMPLETED:
            feedback = Feedback.SAMPLE
        else:
            # Preemptions, disconnects and llama.cpp's empty stream say nothing of load.
            feedback = Feedback.IGNORE if ending.ok else Feedback.DROP
        completion = scanner.completion_tokens
        return Usage(
            scanner.prompt_tokens or exchange.ticket.prompt_tokens,
            completion if completion is not None else scanner.chunks,
            ttft_s=None if self.ttft_s is None else self.ttft_s - admit.queued_s,
            ok=ending.ok,
            feedback=feedback,
        )


class StreamRelay(Relay):
    """Serves streamed requests of one endpoint."""

    def __init__(self, state: GatewayState, endpoint: Endpoint, path: str) -> None:
        super().__init__(state, endpoint, path)
        self._stall_s = state.config.server.client_stall_timeout_s

    async def serve(self, exchange: Exchange) -> None:
        """Open the upstream stream, relay it, end it."""
        response = await self._open(exchange)
        if response is None:
            return
        if response.status != 200 or response.content_type != "text/event-stream":
            body = await self._read_whole(exchange, response)
            if body is not None:
                await relay_answer(exchange, self._profile(exchange), response.status, body)
            return
        await exchange.open_stream()
        progress = _Progress()
        try:
            ending = await self._relay(exchange, response, progress)
        finally:
            # A stream read to its end keeps its connection for the next request; one
            # cut short (the client left, a preemption, a deadline) closes it, which
            # is what tells the engine to stop generating.
            response.release()
        exchange.finish(ending.outcome, progress.usage(exchange, ending), ttft_s=progress.ttft_s)
        if exchange.interrupts.reason is Interrupt.CLIENT_STALLED:
            await exchange.sink.abort()
        elif ending.outcome is not Outcome.CANCELLED and not exchange.interrupts.gone:
            await self._end_stream(exchange, ending.tail)

    async def _read_whole(self, exchange: Exchange, response: Http1Response) -> bytes | None:
        """The body of an answer that is not a stream (an engine error), read under the
        idle deadline and the body cap; ``None`` if the exchange ended instead. A body cut
        off is empty (relayed as the engine's failure); over a cap or not HTTP is a 502."""
        interrupts = exchange.interrupts
        exchange.handle.on_preempt = None
        interrupts.upstream.after(self._idle_s)
        try:
            with interrupts.waiting():
                return await self.state.upstream.read(response, interrupts.upstream, self._idle_s)
        except WaitInterruptedError as exc:
            if exc.reason is Interrupt.UPSTREAM_TIMEOUT:
                raise exchange.fail(
                    GatewayError(504, "upstream_timeout", "the engine did not answer in time")
                ) from None
            if exc.reason is Interrupt.PREEMPTED:
                await self._preempted_before_start(exchange)
            else:
                exchange.finish(Outcome.CANCELLED)
            return None
        except GatewayError as exc:
            if exc.code != "upstream_error":
                raise exchange.fail(exc) from None
            return b""
        finally:
            interrupts.upstream.clear()
            response.release()

    async def _preempted_before_start(self, exchange: Exchange) -> None:
        """Preempted before the stream started: end it with the preempted chunk."""
        exchange.finish(Outcome.PREEMPTED)
        chunk = preempted_chunk(self.endpoint, exchange.ticket.id)
        await exchange.reply(200, chunk, events=True, preempted=True)

    async def _open(self, exchange: Exchange) -> Http1Response | None:
        """Send the request; the engine's response, or ``None`` if the exchange ended first.

        A backend that refused the connection is left for another. The first-byte
        deadline keeps running into the relay: it covers the first event.
        """
        state, ticket, interrupts = self.state, exchange.ticket, exchange.interrupts
        admit = exchange.admit
        assert admit is not None
        handle = exchange.handle
        url = state.backend_url(ticket.model, admit.backend) + self.path
        interrupts.follow(handle)
        interrupts.upstream.after(self._first_byte_s)
        try:
            with interrupts.waiting():
                return await state.upstream.post(
                    url,
                    self.engine_body(exchange, exchange.raw),
                    ticket.id,
                    reuse=state.keeps_alive(ticket.model, admit.backend),
                )
        except WaitInterruptedError as exc:
            handle.on_preempt = None
            if exc.reason is Interrupt.PREEMPTED:
                await self._preempted_before_start(exchange)
                return None
            if exc.reason is Interrupt.UPSTREAM_TIMEOUT:
                raise exchange.fail(
                    GatewayError(504, "upstream_timeout", "the engine did not answer in time")
                ) from None
            exchange.finish(Outcome.CANCELLED)
            return None
        except NotReachedError:
            handle.on_preempt = None
            interrupts.upstream.clear()
        except GatewayError as exc:
            handle.on_preempt = None
            exchange.fail(exc)
            raise
        # Nothing was sent: once admitted again (another backend), open there. Each
        # refusal marks a backend down, and the scheduler bounds how often one comes back.
        if await admission(exchange, exchange.bounce()):
            return await self._open(exchange)
        return None

    async def _relay(
        self, exchange: Exchange, response: Http1Response, progress: _Progress
    ) -> _Ending:
        """Pass whole events through as they arrive, until the stream or the exchange ends."""
        driver, ticket, interrupts = self.state.driver, exchange.ticket, exchange.interrupts
        stream, handle = exchange.sink.stream, exchange.handle
        splitter, scanner = progress.splitter, progress.scanner
        idle_s, stall_s = self._idle_s, self._stall_s
        try:
            with interrupts.waiting():
                while data := await response.readany():
                    progress.received += len(data)
                    interrupts.upstream.after(idle_s)
                    whole, payloads = splitter.feed(data)
                    was_error = scanner.error
                    if payloads and scanner.scan_all(payloads):
                        if progress.ttft_s is None:
                            progress.ttft_s = driver.now() - ticket.arrival
                        # Progress gates preemption of standard priorities (80% of max_tokens).
                        driver.progress(ticket.id, scanner.chunks)
                    if splitter.overflowed:
                        return _EVENT_TOO_LARGE
                    if scanner.malformed:
                        return _MALFORMED
                    if scanner.error and not was_error:
                        whole = openai_error_events(self._profile(exchange), payloads)
                    if whole:
                        interrupts.client.after(stall_s)
                        await stream(whole)
                        interrupts.client.clear()
        except WaitInterruptedError as exc:
            if exc.reason is Interrupt.PREEMPTED:
                return _Ending(Outcome.PREEMPTED, True, preempted_chunk(self.endpoint, ticket.id))
            if exc.reason is Interrupt.UPSTREAM_TIMEOUT:
                return _SILENT
            if exc.reason is Interrupt.DISCONNECTED and scanner.done:
                # The engine's [DONE] reached the client, which then hung up (the
                # official SDKs do) before the engine closed its stream: served whole.
                return _Ending(Outcome.COMPLETED, True, b"")
            return _CANCELLED
        except UpstreamProtocolError as exc:
            return _Ending(Outcome.UPSTREAM_ERROR, False, error_event(exc.code, str(exc)))
        except UpstreamError:
            return _CUT_OFF
        finally:
            interrupts.upstream.clear()
            interrupts.client.clear()
            handle.on_preempt = None
        return self._at_end_of_stream(progress)

    def _profile(self, exchange: Exchange) -> EngineProfile:
        admit = exchange.admit
        assert admit is not None
        return self.state.profile(exchange.ticket.model, admit.backend)

    @staticmethod
    def _at_end_of_stream(progress: _Progress) -> _Ending:
        """How a stream that the engine ended is ended for the client."""
        held, payloads = progress.splitter.close()
        scanner = progress.scanner
        scanner.scan_all(payloads)
        if scanner.malformed:
            return _MALFORMED
        if scanner.error:
            # The engine's own error event went through as it was; the engine failed.
            return _Ending(Outcome.UPSTREAM_ERROR, False, held)
        if progress.received == 0:
            return _EMPTY
        if not scanner.done:
            return _ENDED_EARLY
        return _Ending(Outcome.COMPLETED, True, held)

    async def _end_stream(self, exchange: Exchange, tail: bytes) -> None:
        """Send the last bytes of a stream, still dropping a client that stopped reading."""
        interrupts = exchange.interrupts
        interrupts.reset()
        interrupts.client.after(self._stall_s)
        try:
            with interrupts.waiting():
                await exchange.sink.end_stream(tail)
        except WaitInterruptedError as exc:
            if exc.reason is Interrupt.CLIENT_STALLED:
                await exchange.sink.abort()
        finally:
            interrupts.client.clear()
