"""The OpenAI inference endpoints: authenticate, classify, admit or queue, proxy, release.

One request's life (DESIGN §4): the body is read under a size cap and parsed
once; the bearer key names the tenant; lane, priority and deadline are
classified; the scheduler admits, queues or rejects the ticket; an admitted
request is proxied to the chosen backend (SSE bytes are relayed as they
arrive) and its slot is released with the real usage. A client that leaves
while queued is dropped at once; while running, its upstream request is
closed, which makes vLLM abort it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import zlib

import aiohttp
import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive, Scope, Send

from sluicegate.core.decisions import Admit, Expire, Preempt, PreemptAction, Reject
from sluicegate.core.preemption import required_fraction
from sluicegate.core.ticket import Feedback, Outcome, Ticket, TicketId, Usage
from sluicegate.gateway.asgi import JSON, SSE, Headers, abort_connection, send_body, send_error
from sluicegate.gateway.assemble import StreamAssembler, streamable_copy
from sluicegate.gateway.auth import request_token
from sluicegate.gateway.body import read_body
from sluicegate.gateway.classify import Endpoint, classify, estimate_prompt_tokens, parse_body
from sluicegate.gateway.driver import RunningHandle, Verdict
from sluicegate.gateway.errors import GatewayError, retry_headers
from sluicegate.gateway.interrupts import Interrupt, Interruptible, WaitInterruptedError
from sluicegate.gateway.metrics import LaneMetrics
from sluicegate.gateway.sse import SseScanner
from sluicegate.gateway.state import GatewayState

PATHS: dict[Endpoint, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}
log = logging.getLogger("sluicegate.gateway")
ENGINE_RETRY_AFTER_S = 1.0
_ids = itertools.count(1)
# Ticket ids double as the upstream X-Request-Id: 32 hex digits, which parse as a UUID
# (llama-cpp-python refuses any other shape with an empty 400).
_PREFIX = f"{os.getpid() & 0xFFFFFFFF:08x}"


def _preempted_chunk(endpoint: Endpoint, request_id: str) -> bytes:
    if endpoint == "chat":
        choice: dict[str, object] = {"index": 0, "delta": {}, "finish_reason": "preempted"}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": "", "finish_reason": "preempted"}
        kind = "text_completion"
    event = {"id": request_id, "object": kind, "created": int(time.time()), "choices": [choice]}
    return b"data: " + orjson.dumps(event) + b"\n\ndata: [DONE]\n\n"


def _error_event(code: str, message: str) -> bytes:
    body = {"error": {"message": message, "type": "api_error", "code": code, "param": None}}
    return b"data: " + orjson.dumps(body) + b"\n\ndata: [DONE]\n\n"


class _EmptyStreamError(Exception):
    """The engine answered 200 with an empty event stream."""


class _MalformedStreamError(Exception):
    """The engine's event stream holds something that is not an event."""


def _whole_events(data: bytes) -> tuple[bytes, bytes]:
    """Split ``data`` into the complete SSE events it holds and the incomplete rest."""
    if data.endswith(b"\n\n"):
        return data, b""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
    end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
    return data[:end], data[end:]


async def _watch(receive: Receive, interrupts: Interruptible) -> None:
    """Turn the client's disconnect into an interrupt (one task per admitted request)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            interrupts.fire(Interrupt.DISCONNECTED)
            return


class _Exchange:
    """One admitted-or-waiting request: what every step of serving it needs."""

    __slots__ = ("interrupts", "metrics", "raw", "scope", "send", "ticket")

    def __init__(
        self, scope: Scope, send: Send, ticket: Ticket, metrics: LaneMetrics, raw: bytes
    ) -> None:
        self.scope = scope
        self.send = send
        self.ticket = ticket
        self.metrics = metrics
        self.raw = raw
        self.interrupts = Interruptible()


class InferenceHandler:
    """Serves one OpenAI inference endpoint through the scheduler, as a plain ASGI app."""

    def __init__(self, state: GatewayState, endpoint: Endpoint) -> None:
        self.state = state
        self.endpoint = endpoint
        self.path = PATHS[endpoint]
        server = state.config.server
        self._first_byte_s = server.upstream_first_byte_timeout_s
        self._idle_s = server.upstream_idle_timeout_s
        self._stall_s = server.client_stall_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one request; every failure before the response starts is an OpenAI error."""
        try:
            await self._handle(scope, receive, send)
        except GatewayError as exc:
            await send_error(send, exc)

    def _tenant(self, request: Request) -> str:
        state = self.state
        if not state.auth_required:
            return state.anonymous_tenant
        token = request_token(request.headers)
        tenant = state.keys.tenant(token) if token is not None else None
        if tenant is None:
            raise GatewayError(401, "invalid_api_key", "missing or unknown API key")
        return tenant

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        arrival = state.driver.now()
        request = Request(scope, receive)
        tenant = self._tenant(request)
        try:
            raw = await read_body(request, state.config.server.max_body_bytes)
        except ClientDisconnect:
            return
        parsed = parse_body(raw, self.endpoint)
        model = state.models.get(parsed.model)
        if model is None:
            raise GatewayError(404, "model_not_found", f"model {parsed.model!r} does not exist")
        headers = request.headers
        kind = classify(
            model,
            state.tenant_spec(tenant),
            lane_header=headers.get("x-sluicegate-lane"),
            priority_header=headers.get("x-sluicegate-priority"),
            deadline_header=headers.get("x-sluicegate-deadline-ms"),
            body_priority=parsed.priority,
        )
        max_tokens = (
            1
            if self.endpoint == "embeddings"
            else (parsed.max_tokens or state.config.server.default_max_tokens)
        )
        ticket = Ticket(
            id=TicketId(f"{_PREFIX}{next(_ids):024x}"),
            model=model.name,
            tenant=tenant,
            lane=kind.lane,
            priority=kind.priority,
            prompt_tokens=estimate_prompt_tokens(parsed, state.config.server.chars_per_token),
            max_tokens=max_tokens * parsed.n,
            arrival=arrival,
            deadline=None if kind.deadline_ms is None else arrival + kind.deadline_ms / 1000.0,
            prefix_key=zlib.crc32(parsed.prefix.encode()) if parsed.prefix else None,
            streaming=parsed.stream,
        )
        metrics = state.metrics.lane(ticket.model, ticket.lane)
        waiting = state.driver.submit(ticket)
        if waiting.done():
            verdict = waiting.result()
            if not isinstance(verdict, Admit):
                self._refuse(ticket, verdict, metrics)
        x = _Exchange(scope, send, ticket, metrics, raw)
        watcher = asyncio.create_task(_watch(receive, x.interrupts))
        try:
            admit = await self._verdict(x, waiting)
            if admit is None:
                return
            if parsed.stream:
                await self._stream(x, admit)
            else:
                await self._unary(x, admit)
        except GatewayError:
            raise
        except Exception:
            await self._unexpected(x)
        finally:
            watcher.cancel()
            x.interrupts.close()

    async def _unexpected(self, x: _Exchange) -> None:
        """A bug or an answer nothing above foresaw: free the slot (once), tell the client."""
        log.exception("unexpected error while serving request %s", x.ticket.id)
        if self.state.scheduler.state_of(x.ticket.id) is not None:
            self._end(x, Outcome.UPSTREAM_ERROR, ok=False)
        error = GatewayError(502, "upstream_error", "the gateway could not relay the answer")
        try:
            await send_error(x.send, error)
        except RuntimeError:  # the response had already started
            await abort_connection(x.scope)

    def _refuse(self, ticket: Ticket, verdict: Reject | Expire, metrics: LaneMetrics) -> None:
        """Raise the error a rejected or expired ticket is answered with."""
        if isinstance(verdict, Reject):
            metrics.ended(verdict.outcome)
            raise GatewayError(
                verdict.status,
                verdict.code.value,
                verdict.message,
                retry_after_s=verdict.retry_after_s,
            )
        metrics.ended(Outcome.EXPIRED)
        raise GatewayError(
            503,
            "queue_timeout",
            "request waited too long in the queue",
            retry_after_s=verdict.retry_after_s,
        )

    async def _verdict(self, x: _Exchange, waiting: asyncio.Future[Verdict]) -> Admit | None:
        """Wait for admission; ``None`` if the client left; raise on reject/expire."""
        interrupts = x.interrupts
        try:
            if waiting.cancelled():
                raise WaitInterruptedError(Interrupt.DISCONNECTED)
            if waiting.done():
                verdict = waiting.result()
            else:
                interrupts.arm()
                try:
                    verdict = await waiting
                except asyncio.CancelledError:
                    raise interrupts.interrupted() from None
                finally:
                    interrupts.disarm()
        except WaitInterruptedError:
            self.state.driver.cancel(x.ticket.id)
            x.metrics.ended(Outcome.CANCELLED)
            return None
        if not isinstance(verdict, Admit):
            self._refuse(x.ticket, verdict, x.metrics)
        assert isinstance(verdict, Admit)
        x.metrics.queue_wait.observe(verdict.queued_s)
        return verdict

    def _headers(self, ticket: Ticket, admit: Admit) -> Headers:
        return [
            (b"x-sluicegate-queue-ms", b"%.1f" % (admit.queued_s * 1000)),
            (b"x-sluicegate-lane", ticket.lane.encode()),
        ]

    def _finish(self, x: _Exchange, usage: Usage, outcome: Outcome, ttft_s: float | None) -> None:
        """Release the ticket's slot with its real usage and count how it ended."""
        state, ticket, metrics = self.state, x.ticket, x.metrics
        state.driver.complete(ticket.id, usage)
        metrics.ended(outcome)
        metrics.duration.observe(state.driver.now() - ticket.arrival)
        if ttft_s is not None:
            metrics.ttft.observe(ttft_s)
        state.metrics.served(
            ticket.model, ticket.tenant, usage.prompt_tokens, usage.completion_tokens
        )

    def _end(self, x: _Exchange, outcome: Outcome, *, generated: int = 0, ok: bool = True) -> None:
        """``_finish`` for an answer that never reached the client whole.

        A failure (``ok=False``) is a drop for the adaptive limit; anything else that
        ends here (a disconnect, a preemption) tells it nothing.
        """
        feedback = Feedback.DROP if not ok else Feedback.IGNORE
        usage = Usage(x.ticket.prompt_tokens, generated, ok=ok, feedback=feedback)
        self._finish(x, usage, outcome, None)

    def _timed_out(self, x: _Exchange) -> GatewayError:
        """End a ticket whose engine did not answer in time; the error to answer with."""
        self._end(x, Outcome.UPSTREAM_ERROR, ok=False)
        return GatewayError(504, "upstream_timeout", "the engine did not answer in time")

    def _watch_preemption(self, interrupts: Interruptible, handle: RunningHandle) -> None:
        handle.on_preempt = interrupts.preempted
        if handle.preempt is not None:
            interrupts.fire(Interrupt.PREEMPTED)

    # ------------------------------------------------------------------ unary

    async def _unary(self, x: _Exchange, admit: Admit) -> None:
        state, ticket, interrupts, raw = self.state, x.ticket, x.interrupts, x.raw
        upstream_body: bytes | None = None
        while True:
            handle = state.driver.handle(ticket.id)
            url = state.backend_url(ticket.model, admit.backend) + self.path
            if upstream_body is None:
                upstream_body = raw
                if self._streams_upstream(ticket, admit.backend):
                    upstream_body = streamable_copy(raw) or raw
            assembler = StreamAssembler(self.endpoint) if upstream_body is not raw else None
            response: aiohttp.ClientResponse | None = None
            self._watch_preemption(interrupts, handle)
            try:
                interrupts.arm()
                interrupts.upstream.after(self._first_byte_s)
                try:
                    response = await state.upstream.post(
                        url,
                        upstream_body,
                        ticket.id,
                        reuse=state.keeps_alive(ticket.model, admit.backend),
                    )
                    interrupts.upstream.after(self._idle_s)
                    first_token_s = None
                    if assembler is not None and response.status == 200:
                        first_token_s = await self._gather(x, response, assembler)
                        body = assembler.body(prompt_tokens=ticket.prompt_tokens)
                    else:
                        body = await state.upstream.read(response)
                except asyncio.CancelledError:
                    raise interrupts.interrupted() from None
                finally:
                    interrupts.disarm()
                    interrupts.upstream.clear()
                    handle.on_preempt = None
            except _EmptyStreamError:
                # llama.cpp answers an over-long prompt with an empty stream; the same
                # request unstreamed gets its real 400.
                if response is not None:
                    response.close()
                upstream_body = raw
                continue
            except WaitInterruptedError as exc:
                if response is not None:
                    response.close()
                if exc.reason is Interrupt.PREEMPTED:
                    preempt = handle.preempt
                    assert preempt is not None
                    interrupts.reset()
                    generated = len(assembler.parts) if assembler is not None else 0
                    next_admit = await self._after_preempt(x, preempt, generated)
                    if next_admit is None:
                        if not interrupts.gone:
                            await self._send_preempted_body(x, admit, assembler)
                        return
                    admit = next_admit
                    continue
                if exc.reason is Interrupt.UPSTREAM_TIMEOUT:
                    raise self._timed_out(x) from None
                self._end(x, Outcome.CANCELLED)
                return
            except BaseException as exc:
                if response is not None:
                    response.close()
                if isinstance(exc, GatewayError):
                    self._end(x, Outcome.UPSTREAM_ERROR, ok=False)
                raise
            response.release()
            ttft_s = None if first_token_s is None else first_token_s - admit.queued_s
            await self._relay_unary(x, admit, response.status, body, ttft_s=ttft_s)
            return

    def _streams_upstream(self, ticket: Ticket, backend: str) -> bool:
        """Whether a non-streamed request is sent to the engine as a stream and reassembled:
        so that a preemption keeps the text so far, and so that an engine that cannot abort a
        non-streamed generation (llama.cpp) stops when the client leaves."""
        if self.endpoint == "embeddings":
            return False
        engine = self.state.backend_engine(ticket.model, backend)
        if engine == "llamacpp":
            return True
        # The lane could preempt it with ``abort``.
        lane = self.state.models[ticket.model].lane(ticket.lane)
        return (
            lane.preempt_action == "abort" and required_fraction(lane, ticket.priority) is not None
        )

    async def _gather(
        self, x: _Exchange, response: aiohttp.ClientResponse, assembler: StreamAssembler
    ) -> float | None:
        """Read the engine's stream into ``assembler``; return when its first token came
        (from the ticket's arrival), or ``None`` if none did."""
        driver, ticket, interrupts = self.state.driver, x.ticket, x.interrupts
        received = 0
        first_token_s: float | None = None
        parts = assembler.parts
        try:
            async for data in response.content.iter_any():
                received += len(data)
                interrupts.upstream.after(self._idle_s)
                before = len(parts)
                assembler.feed(data)
                if first_token_s is None and any(parts[before:]):
                    first_token_s = driver.now() - ticket.arrival
                driver.progress(ticket.id, len(parts))
        except aiohttp.ClientError as exc:
            raise GatewayError(502, "upstream_error", "the engine's answer was cut off") from exc
        if received == 0:
            raise _EmptyStreamError
        if not assembler.done:
            raise GatewayError(502, "upstream_error", "the engine ended the answer early")
        return first_token_s

    async def _after_preempt(self, x: _Exchange, preempt: Preempt, generated: int) -> Admit | None:
        """Free the preempted slot; for ``requeue`` wait for the next admission."""
        driver, ticket = self.state.driver, x.ticket
        if preempt.action is PreemptAction.REQUEUE:
            waiting = driver.requeue_wait(ticket.id)
            driver.complete(
                ticket.id, Usage(ticket.prompt_tokens, generated, feedback=Feedback.IGNORE)
            )
            return await self._verdict(x, waiting)
        self._end(x, Outcome.PREEMPTED, generated=generated)
        return None

    async def _send_preempted_body(
        self, x: _Exchange, admit: Admit, assembler: StreamAssembler | None
    ) -> None:
        ticket = x.ticket
        if assembler is None:
            assembler = StreamAssembler(self.endpoint)
        if not assembler.id:
            assembler.id, assembler.model = ticket.id, ticket.model
        body = assembler.body(prompt_tokens=ticket.prompt_tokens, finish_reason="preempted")
        headers = [JSON, *self._headers(ticket, admit), (b"x-sluicegate-preempted", b"1")]
        await send_body(x.send, 200, body, headers)

    async def _relay_unary(
        self, x: _Exchange, admit: Admit, status: int, body: bytes, *, ttft_s: float | None = None
    ) -> None:
        """Answer with the engine's whole body; ``ttft_s`` (from admission) if it was streamed.

        For the adaptive limit a success is a latency sample, the engine's 429 a drop
        (like its 5xx, which also count against the circuit), any other 4xx nothing.
        """
        ticket = x.ticket
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None
        if status >= 500 or not isinstance(parsed, dict):
            self._end(x, Outcome.UPSTREAM_ERROR, ok=False)
            raise GatewayError(502, "upstream_error", f"the engine answered {status}")
        usage = parsed.get("usage")
        prompt, completion = ticket.prompt_tokens, 0
        if isinstance(usage, dict):
            reported = usage.get("prompt_tokens")
            if type(reported) is int and reported >= 0:
                prompt = reported
            reported = usage.get("completion_tokens")
            if type(reported) is int and reported >= 0:
                completion = reported
        elapsed = self.state.driver.now() - ticket.arrival
        outcome = Outcome.COMPLETED if status < 400 else Outcome.UPSTREAM_ERROR
        if status < 400:
            feedback = Feedback.SAMPLE
        else:
            feedback = Feedback.DROP if status == 429 else Feedback.IGNORE
        usage = Usage(prompt, completion, ttft_s=ttft_s, feedback=feedback)
        self._finish(x, usage, outcome, elapsed)
        headers = [JSON, *self._headers(ticket, admit)]
        if status == 429:
            # The engine's own 429 (its headers are not relayed) still tells SDKs when to retry.
            headers.extend(
                (name.lower().encode(), value.encode())
                for name, value in retry_headers(ENGINE_RETRY_AFTER_S).items()
            )
        await send_body(x.send, status, body, headers)

    # ------------------------------------------------------------------ stream

    async def _stream(self, x: _Exchange, admit: Admit) -> None:
        state, ticket, interrupts = self.state, x.ticket, x.interrupts
        handle = state.driver.handle(ticket.id)
        url = state.backend_url(ticket.model, admit.backend) + self.path
        self._watch_preemption(interrupts, handle)
        try:
            interrupts.arm()
            interrupts.upstream.after(self._first_byte_s)
            try:
                response = await state.upstream.post(
                    url, x.raw, ticket.id, reuse=state.keeps_alive(ticket.model, admit.backend)
                )
            except asyncio.CancelledError:
                raise interrupts.interrupted() from None
            finally:
                interrupts.disarm()
        except WaitInterruptedError as exc:
            handle.on_preempt = None
            if exc.reason is Interrupt.PREEMPTED:
                self._end(x, Outcome.PREEMPTED)
                headers = [*SSE, *self._headers(ticket, admit), (b"x-sluicegate-preempted", b"1")]
                await send_body(x.send, 200, _preempted_chunk(self.endpoint, ticket.id), headers)
                return
            if exc.reason is Interrupt.UPSTREAM_TIMEOUT:
                raise self._timed_out(x) from None
            self._end(x, Outcome.CANCELLED)
            return
        except GatewayError:
            handle.on_preempt = None
            self._end(x, Outcome.UPSTREAM_ERROR, ok=False)
            raise
        if response.status != 200 or response.content_type != "text/event-stream":
            handle.on_preempt = None
            interrupts.upstream.clear()
            try:
                body = await state.upstream.read(response)
            except GatewayError:
                body = b""
            finally:
                response.release()
            await self._relay_unary(x, admit, response.status, body)
            return
        await x.send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [*SSE, *self._headers(ticket, admit)],
            }
        )
        await self._relay(x, admit, response, handle)

    async def _relay(
        self,
        x: _Exchange,
        admit: Admit,
        response: aiohttp.ClientResponse,
        handle: RunningHandle,
    ) -> None:
        """Pass SSE bytes through as they arrive; account for them; end exactly once."""
        driver, ticket, interrupts, send = self.state.driver, x.ticket, x.interrupts, x.send
        scanner = SseScanner()
        ttft_s: float | None = None
        outcome = Outcome.COMPLETED
        ok = True
        tail: bytes | None = None
        pending = b""
        received = 0
        content = response.content
        idle_s, stall_s = self._idle_s, self._stall_s
        try:
            try:
                interrupts.arm()
                while data := await content.readany():
                    received += len(data)
                    interrupts.upstream.after(idle_s)
                    if scanner.feed(data):
                        if ttft_s is None:
                            ttft_s = driver.now() - ticket.arrival
                        # Progress gates preemption of standard priorities (80% of max_tokens).
                        driver.progress(ticket.id, scanner.chunks)
                    if scanner.malformed:
                        raise _MalformedStreamError
                    # Only whole events go out, so an error event never lands mid-event.
                    data, pending = _whole_events(pending + data if pending else data)
                    if not data:
                        continue
                    interrupts.client.after(stall_s)
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                    interrupts.client.clear()
            except asyncio.CancelledError:
                raise interrupts.interrupted() from None
            finally:
                interrupts.disarm()
                interrupts.upstream.clear()
                interrupts.client.clear()
                handle.on_preempt = None
        except WaitInterruptedError as exc:
            if exc.reason is Interrupt.PREEMPTED:
                outcome = Outcome.PREEMPTED
                tail = _preempted_chunk(self.endpoint, ticket.id)
            elif exc.reason is Interrupt.UPSTREAM_TIMEOUT:
                ok, outcome = False, Outcome.UPSTREAM_ERROR
                tail = _error_event("upstream_timeout", "the engine's stream went silent")
            else:
                outcome = Outcome.CANCELLED
        except _MalformedStreamError:
            ok, outcome = False, Outcome.UPSTREAM_ERROR
            tail = _error_event("upstream_error", "the engine sent a malformed event")
        except aiohttp.ClientError:
            ok, outcome = False, Outcome.UPSTREAM_ERROR
            tail = _error_event("upstream_error", "the engine's stream was cut off")
        else:
            if scanner.error:
                # The engine's own error event went through as it was; the engine failed.
                ok, outcome = False, Outcome.UPSTREAM_ERROR
                tail = pending
            elif received == 0:
                # llama.cpp's answer to a prompt longer than its context: a request problem,
                # not an engine failure, so the circuit is left alone.
                outcome = Outcome.UPSTREAM_ERROR
                tail = _error_event(
                    "empty_stream",
                    "the engine returned an empty stream (is the prompt longer than its context?)",
                )
            elif not scanner.done:
                ok, outcome = False, Outcome.UPSTREAM_ERROR
                tail = _error_event("upstream_error", "the engine ended the stream early")
            else:
                tail = pending
        finally:
            response.close()
            completion = scanner.completion_tokens
            if outcome is Outcome.COMPLETED:
                feedback = Feedback.SAMPLE
            else:
                # Preemptions, disconnects and llama.cpp's empty stream say nothing of load.
                feedback = Feedback.DROP if not ok else Feedback.IGNORE
            usage = Usage(
                scanner.prompt_tokens or ticket.prompt_tokens,
                completion if completion is not None else scanner.chunks,
                ttft_s=None if ttft_s is None else ttft_s - admit.queued_s,
                ok=ok,
                feedback=feedback,
            )
            self._finish(x, usage, outcome, ttft_s)
        if interrupts.reason is Interrupt.CLIENT_STALLED:
            await abort_connection(x.scope)
        elif outcome is not Outcome.CANCELLED:
            await self._end_stream(x, tail or b"")

    async def _end_stream(self, x: _Exchange, tail: bytes) -> None:
        """Send the last bytes of a stream, still dropping a client that stopped reading."""
        interrupts = x.interrupts
        interrupts.reset()
        try:
            interrupts.arm()
            interrupts.client.after(self._stall_s)
            try:
                await x.send({"type": "http.response.body", "body": tail, "more_body": False})
            except asyncio.CancelledError:
                raise interrupts.interrupted() from None
            finally:
                interrupts.disarm()
                interrupts.client.clear()
        except WaitInterruptedError as exc:
            if exc.reason is Interrupt.CLIENT_STALLED:
                await abort_connection(x.scope)
