"""Serving a non-streamed request: upstream attempts until one ends the exchange.

An attempt sends the request to the backend of the current admission and
relays the whole answer. Three things start another attempt instead: a
``requeue`` preemption and a backend that refused the connection before
anything was sent (the next one runs after the ticket is admitted again), and
llama.cpp's empty stream (the same request, sent unstreamed, to get the
engine's real error).

A request is sent upstream as a stream and reassembled (``assemble.py``) when
it could ever be preempted with ``abort`` (its lane's rule allows it and some
ticket of the model could be chosen over it: ``GatewayState.streams_to_keep_text``),
so that the text so far survives, and when its backend is llama.cpp, so that a
client that leaves stops the engine; unless it uses fields the assembler does
not merge. The stream's reads are fed to the assembler as they arrive, on the
connection's side (``Http1Response.consume``): the request's task wakes once.
"""

from __future__ import annotations

from typing import NamedTuple

from sluicegate.core.decisions import Preempt, PreemptAction
from sluicegate.core.ticket import Outcome
from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.request.admission_wait import admission
from sluicegate.gateway.request.exchange import Exchange
from sluicegate.gateway.request.interrupts import Interrupt, WaitInterruptedError
from sluicegate.gateway.request.relay import Relay
from sluicegate.gateway.request.replies import relay_answer
from sluicegate.gateway.streams.assemble import StreamAssembler, streamable_copy
from sluicegate.gateway.streams.sse import EVENT_TOO_LARGE
from sluicegate.gateway.upstream.clients import NotReachedError, answer_error
from sluicegate.gateway.upstream.http1 import Http1Response, UpstreamError


class _Answer(NamedTuple):
    """The engine's whole answer, and when its first token came (from arrival) if streamed."""

    status: int
    body: bytes
    first_token_s: float | None


class UnaryRelay(Relay):
    """Serves non-streamed requests of one endpoint."""

    async def serve(self, exchange: Exchange) -> None:
        """Run attempts until the exchange has ended (answered, refused, failed or left).

        Each attempt returns the body its successor sends, or ``None`` when none follows.
        """
        body: bytes | None = self._upstream_body(exchange)
        while body is not None:
            body = await self._attempt(exchange, body)

    def _upstream_body(self, exchange: Exchange) -> bytes:
        """What the first attempt sends: the request as received, or its streamed copy."""
        raw = exchange.raw
        if not self._reassembles(exchange):
            return raw
        return streamable_copy(raw) or raw

    def _reassembles(self, exchange: Exchange) -> bool:
        if self.endpoint == "embeddings":
            return False
        ticket, admit = exchange.ticket, exchange.admit
        assert admit is not None
        if self.state.streams_unary(ticket.model, admit.backend):
            return True
        return self.state.streams_to_keep_text(ticket.model, ticket.lane, ticket.priority)

    async def _attempt(self, exchange: Exchange, body: bytes) -> bytes | None:
        """One upstream request with ``body``; the next attempt's body, or ``None``."""
        assembler = StreamAssembler(self.endpoint) if body is not exchange.raw else None
        handle = exchange.handle
        exchange.interrupts.follow(handle)
        answer: _Answer | None = None
        interrupt: Interrupt | None = None
        refused = False
        try:
            answer = await self._request(exchange, body, assembler)
        except WaitInterruptedError as exc:
            interrupt = exc.reason
        except NotReachedError:
            refused = True
        except GatewayError as exc:
            exchange.fail(exc)
            raise
        finally:
            handle.on_preempt = None
        if refused:
            # Nothing was sent: once admitted again (another backend), send it as that
            # backend takes it.
            if await admission(exchange, exchange.bounce()):
                return self._upstream_body(exchange)
            return None
        if interrupt is Interrupt.PREEMPTED:
            assert handle.preempt is not None
            return await self._preempted(exchange, handle.preempt, body, assembler)
        if interrupt is Interrupt.UPSTREAM_TIMEOUT:
            timeout = GatewayError(504, "upstream_timeout", "the engine did not answer in time")
            raise exchange.fail(timeout)
        if interrupt is not None:  # the client left
            exchange.finish(Outcome.CANCELLED)
            return None
        if answer is None:
            # llama.cpp answers an over-long prompt with an empty stream; the same request
            # unstreamed gets its real 400.
            return exchange.raw
        admit = exchange.admit
        assert admit is not None
        first = answer.first_token_s
        ttft_s = None if first is None else first - admit.queued_s
        profile = self.state.profile(exchange.ticket.model, admit.backend)
        await relay_answer(exchange, profile, answer.status, answer.body, ttft_s=ttft_s)
        return None

    async def _request(
        self, exchange: Exchange, body: bytes, assembler: StreamAssembler | None
    ) -> _Answer | None:
        """Send ``body`` and read the whole answer (``None``: an empty stream)."""
        state, ticket, interrupts = self.state, exchange.ticket, exchange.interrupts
        admit = exchange.admit
        assert admit is not None
        url = state.backend_url(ticket.model, admit.backend) + self.path
        answer: _Answer | None
        interrupts.upstream.after(self._first_byte_s)
        try:
            with interrupts.waiting():
                response = await state.upstream.post(
                    url,
                    self.engine_body(exchange, body),
                    ticket.id,
                    reuse=state.keeps_alive(ticket.model, admit.backend),
                )
                try:
                    interrupts.upstream.after(self._idle_s)
                    if assembler is None or response.status != 200:
                        whole = await state.upstream.read(
                            response, interrupts.upstream, self._idle_s
                        )
                        answer = _Answer(response.status, whole, None)
                    else:
                        answer = await self._gather(exchange, response, assembler)
                except BaseException:
                    response.close()
                    raise
        finally:
            interrupts.upstream.clear()
        if answer is None:
            response.close()
        else:
            response.release()
        return answer

    async def _gather(
        self, exchange: Exchange, response: Http1Response, assembler: StreamAssembler
    ) -> _Answer | None:
        """Read the engine's stream into ``assembler`` and rebuild the answer (``None``: the
        stream was empty). An engine error event, a malformed event, a cut or an early end
        is a 502 ``upstream_error``."""
        driver, ticket = self.state.driver, exchange.ticket
        idle, idle_s = exchange.interrupts.upstream, self._idle_s
        first_token_s: float | None = None

        def piece(data: bytes) -> bool:
            # Called for each read of the stream as it arrives, outside this task.
            nonlocal first_token_s
            idle.after(idle_s)
            if assembler.feed(data):
                first_token_s = driver.now() - ticket.arrival
            driver.progress(ticket.id, assembler.progress)
            return assembler.error or assembler.malformed

        response.limit_body(self.state.upstream.limits.body_bytes)
        try:
            await response.consume(piece)
        except UpstreamError as exc:
            raise answer_error(exc) from exc
        if assembler.overflowed:
            raise GatewayError(502, "upstream_event_too_large", EVENT_TOO_LARGE)
        if response.received == 0:
            return None
        assembler.close()
        if assembler.error:
            raise GatewayError(502, "upstream_error", "the engine reported an error mid-answer")
        if assembler.malformed:
            raise GatewayError(502, "upstream_error", "the engine sent a malformed event")
        if not assembler.done:
            raise GatewayError(502, "upstream_error", "the engine ended the answer early")
        return _Answer(200, assembler.body(prompt_tokens=ticket.prompt_tokens), first_token_s)

    async def _preempted(
        self, exchange: Exchange, preempt: Preempt, body: bytes, assembler: StreamAssembler | None
    ) -> bytes | None:
        """The running attempt was preempted: requeue (the next attempt sends ``body`` once
        admitted again) or abort (answer with the text so far)."""
        interrupts = exchange.interrupts
        interrupts.reset()
        generated = assembler.progress if assembler is not None else 0
        if preempt.action is PreemptAction.REQUEUE:
            if await admission(exchange, exchange.requeue(generated)):
                return body
        else:
            exchange.finish(Outcome.PREEMPTED, exchange.cut_short(generated))
        if not interrupts.gone:
            await self._send_preempted(exchange, assembler)
        return None

    async def _send_preempted(self, exchange: Exchange, assembler: StreamAssembler | None) -> None:
        ticket = exchange.ticket
        if assembler is None:
            assembler = StreamAssembler(self.endpoint)
        body = assembler.body(
            prompt_tokens=ticket.prompt_tokens,
            finish_reason="preempted",
            fallback_id=ticket.id,
            fallback_model=ticket.model,
        )
        await exchange.reply(200, body, preempted=True)
