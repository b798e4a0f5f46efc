"""The OpenAI inference endpoints: authenticate, classify, admit or queue, proxy, release.

One request's life (SPEC §3): the body is read under a size cap and parsed
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
import os
import time
import zlib
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import aiohttp
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive

from sluicegate.core.decisions import Admit, Expire, Preempt, PreemptAction, Reject
from sluicegate.core.preemption import required_fraction
from sluicegate.core.ticket import Outcome, Ticket, TicketId, Usage
from sluicegate.gateway.assemble import StreamAssembler, streamable_copy
from sluicegate.gateway.auth import bearer
from sluicegate.gateway.body import read_body
from sluicegate.gateway.classify import Endpoint, classify, estimate_prompt_tokens, parse_body
from sluicegate.gateway.driver import RunningHandle, Verdict
from sluicegate.gateway.errors import GatewayError, error_response
from sluicegate.gateway.sse import SseScanner
from sluicegate.gateway.state import GatewayState

T = TypeVar("T")
PATHS: dict[Endpoint, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}
_ids = itertools.count(1)
_PREFIX = f"{os.getpid():x}"


class _DisconnectedError(Exception):
    """The client went away while we waited on its behalf."""


class _PreemptedError(Exception):
    """The scheduler preempted this request while it ran."""


async def _until_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _race(request: Request, work: Awaitable[T], handle: RunningHandle | None = None) -> T:
    """Await ``work`` unless the client disconnects (or the request is preempted) first."""
    task: asyncio.Future[T] = asyncio.ensure_future(work)
    disconnect: asyncio.Future[None] = asyncio.ensure_future(_until_disconnect(request.receive))
    preempted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    if handle is not None:
        if handle.preempt is not None:
            preempted.set_result(None)
        else:
            handle.on_preempt = lambda _decision: _settle(preempted)
    try:
        await asyncio.wait((task, disconnect, preempted), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        disconnect.cancel()
        if handle is not None:
            handle.on_preempt = None
    if task.done():
        preempted.cancel()
        return task.result()
    task.cancel()
    if preempted.done() and not preempted.cancelled():
        raise _PreemptedError
    preempted.cancel()
    raise _DisconnectedError


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


class InferenceHandler:
    """Serves one OpenAI inference endpoint through the scheduler."""

    def __init__(self, state: GatewayState, endpoint: Endpoint) -> None:
        self.state = state
        self.endpoint = endpoint
        self.path = PATHS[endpoint]

    async def handle(self, request: Request) -> Response:
        """Handle one request; every failure is an OpenAI-shaped error."""
        try:
            return await self._handle(request)
        except GatewayError as exc:
            return exc.response()

    def _tenant(self, request: Request) -> str:
        state = self.state
        if not state.auth_required:
            return state.anonymous_tenant
        token = bearer(request.headers.get("authorization"))
        tenant = state.keys.tenant(token) if token is not None else None
        if tenant is None:
            raise GatewayError(401, "invalid_api_key", "missing or unknown API key")
        return tenant

    async def _handle(self, request: Request) -> Response:
        state = self.state
        arrival = state.driver.now()
        tenant = self._tenant(request)
        raw = await read_body(request, state.config.server.max_body_bytes)
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
            id=TicketId(f"{_PREFIX}-{next(_ids)}"),
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
        verdict = await self._verdict(request, ticket, state.driver.submit(ticket))
        if verdict is None:
            return Response(status_code=499)
        if parsed.stream:
            return await self._stream(request, ticket, verdict, raw)
        return await self._unary(request, ticket, verdict, raw)

    async def _verdict(
        self, request: Request, ticket: Ticket, waiting: asyncio.Future[Verdict]
    ) -> Admit | None:
        """Wait for admission; ``None`` if the client left; raise on reject/expire."""
        try:
            verdict = waiting.result() if waiting.done() else await _race(request, waiting)
        except (_DisconnectedError, asyncio.CancelledError):
            self.state.driver.cancel(ticket.id)
            self.state.metrics.ended(ticket.model, ticket.lane, Outcome.CANCELLED)
            return None
        if isinstance(verdict, Reject):
            self.state.metrics.ended(ticket.model, ticket.lane, verdict.outcome)
            raise GatewayError(
                verdict.status,
                verdict.code.value,
                verdict.message,
                retry_after_s=verdict.retry_after_s,
            )
        if isinstance(verdict, Expire):
            self.state.metrics.ended(ticket.model, ticket.lane, Outcome.EXPIRED)
            raise GatewayError(
                503,
                "queue_timeout",
                "request waited too long in the queue",
                retry_after_s=verdict.retry_after_s,
            )
        self.state.metrics.queue_wait.labels(ticket.model, ticket.lane).observe(verdict.queued_s)
        return verdict

    def _headers(self, ticket: Ticket, admit: Admit) -> dict[str, str]:
        return {
            "X-Sluicegate-Queue-Ms": f"{admit.queued_s * 1000:.1f}",
            "X-Sluicegate-Lane": ticket.lane,
        }

    def _finish(self, ticket: Ticket, usage: Usage, outcome: Outcome, ttft_s: float | None) -> None:
        state = self.state
        state.driver.complete(ticket.id, usage)
        now = state.driver.now()
        metrics = state.metrics
        metrics.ended(ticket.model, ticket.lane, outcome)
        metrics.duration.labels(ticket.model, ticket.lane).observe(now - ticket.arrival)
        if ttft_s is not None:
            metrics.ttft.labels(ticket.model, ticket.lane).observe(ttft_s)
        metrics.served(ticket.model, ticket.tenant, usage.prompt_tokens, usage.completion_tokens)

    # ------------------------------------------------------------------ unary

    async def _unary(self, request: Request, ticket: Ticket, admit: Admit, raw: bytes) -> Response:
        state = self.state
        # A request that may be preempted with ``abort`` is streamed from the engine and
        # reassembled here, so that a preemption still returns the text generated so far.
        streamed = self._may_abort(ticket)
        upstream_body = (streamable_copy(raw) if streamed else None) or raw
        while True:
            handle = state.driver.handle(ticket.id)
            url = state.backend_url(ticket.model, admit.backend) + self.path
            assembler = StreamAssembler(self.endpoint) if upstream_body is not raw else None
            try:
                response = await _race(
                    request, state.upstream.post(url, upstream_body, ticket.id), handle
                )
                try:
                    if assembler is not None and response.status == 200:
                        await _race(request, self._gather(ticket, response, assembler), handle)
                        body = assembler.body(prompt_tokens=ticket.prompt_tokens)
                    else:
                        body = await _race(request, state.upstream.read(response), handle)
                except BaseException:
                    response.close()
                    raise
                response.release()
            except _PreemptedError:
                preempt = handle.preempt
                assert preempt is not None
                generated = len(assembler.parts) if assembler is not None else 0
                next_admit = await self._after_preempt(request, ticket, preempt, generated)
                if next_admit is None:
                    return self._preempted_body(ticket, admit, assembler)
                admit = next_admit
                continue
            except _DisconnectedError:
                self._finish(ticket, Usage(ticket.prompt_tokens, 0), Outcome.CANCELLED, None)
                return Response(status_code=499)
            except GatewayError:
                usage = Usage(ticket.prompt_tokens, 0, ok=False)
                self._finish(ticket, usage, Outcome.UPSTREAM_ERROR, None)
                raise
            return self._relay_unary(ticket, admit, response.status, body)

    def _may_abort(self, ticket: Ticket) -> bool:
        """Whether the ticket's lane could preempt it with ``abort``."""
        lane = self.state.models[ticket.model].lane(ticket.lane)
        return (
            self.endpoint != "embeddings"
            and lane.preempt_action == "abort"
            and required_fraction(lane, ticket.priority) is not None
        )

    async def _gather(
        self, ticket: Ticket, response: aiohttp.ClientResponse, assembler: StreamAssembler
    ) -> None:
        try:
            async for data in response.content.iter_any():
                assembler.feed(data)
                self.state.driver.progress(ticket.id, len(assembler.parts))
        except TimeoutError as exc:
            raise GatewayError(504, "upstream_timeout", "the engine stopped answering") from exc
        except aiohttp.ClientError as exc:
            raise GatewayError(502, "upstream_error", "the engine's answer was cut off") from exc
        if not assembler.done:
            raise GatewayError(502, "upstream_error", "the engine ended the answer early")

    async def _after_preempt(
        self, request: Request, ticket: Ticket, preempt: Preempt, generated: int
    ) -> Admit | None:
        """Free the preempted slot; for ``requeue`` wait for the next admission."""
        driver = self.state.driver
        if preempt.action is PreemptAction.REQUEUE:
            waiting = driver.requeue_wait(ticket.id)
            driver.complete(ticket.id, Usage(ticket.prompt_tokens, generated))
            return await self._verdict(request, ticket, waiting)
        usage = Usage(ticket.prompt_tokens, generated)
        self._finish(ticket, usage, Outcome.PREEMPTED, None)
        return None

    def _preempted_body(
        self, ticket: Ticket, admit: Admit, assembler: StreamAssembler | None
    ) -> Response:
        if assembler is None:
            assembler = StreamAssembler(self.endpoint)
        if not assembler.id:
            assembler.id, assembler.model = ticket.id, ticket.model
        body = assembler.body(prompt_tokens=ticket.prompt_tokens, finish_reason="preempted")
        headers = {**self._headers(ticket, admit), "X-Sluicegate-Preempted": "1"}
        return Response(body, media_type="application/json", headers=headers)

    def _relay_unary(self, ticket: Ticket, admit: Admit, status: int, body: bytes) -> Response:
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None
        if status >= 500 or not isinstance(parsed, dict):
            self._finish(
                ticket, Usage(ticket.prompt_tokens, 0, ok=False), Outcome.UPSTREAM_ERROR, None
            )
            return error_response(502, "upstream_error", f"the engine answered {status}")
        usage = parsed.get("usage")
        prompt, completion = ticket.prompt_tokens, 0
        if isinstance(usage, dict):
            prompt = int(usage.get("prompt_tokens") or prompt)
            completion = int(usage.get("completion_tokens") or 0)
        elapsed = self.state.driver.now() - ticket.arrival
        outcome = Outcome.COMPLETED if status < 400 else Outcome.UPSTREAM_ERROR
        self._finish(ticket, Usage(prompt, completion, ttft_s=None), outcome, elapsed)
        return Response(
            body,
            status_code=status,
            media_type="application/json",
            headers=self._headers(ticket, admit),
        )

    # ------------------------------------------------------------------ stream

    async def _stream(self, request: Request, ticket: Ticket, admit: Admit, raw: bytes) -> Response:
        state = self.state
        handle = state.driver.handle(ticket.id)
        url = state.backend_url(ticket.model, admit.backend) + self.path
        try:
            response = await _race(request, state.upstream.post(url, raw, ticket.id), handle)
        except _PreemptedError:
            self._finish(ticket, Usage(ticket.prompt_tokens, 0), Outcome.PREEMPTED, None)
            return StreamingResponse(
                iter([_preempted_chunk(self.endpoint, ticket.id)]),
                media_type="text/event-stream",
                headers={**self._headers(ticket, admit), "X-Sluicegate-Preempted": "1"},
            )
        except _DisconnectedError:
            self._finish(ticket, Usage(ticket.prompt_tokens, 0), Outcome.CANCELLED, None)
            return Response(status_code=499)
        except GatewayError:
            self._finish(
                ticket, Usage(ticket.prompt_tokens, 0, ok=False), Outcome.UPSTREAM_ERROR, None
            )
            raise
        if response.status != 200:
            try:
                body = await state.upstream.read(response)
            except GatewayError:
                body = b""
            finally:
                response.release()
            return self._relay_unary(ticket, admit, response.status, body)
        return StreamingResponse(
            self._relay(ticket, admit, response, handle),
            media_type="text/event-stream",
            headers={**self._headers(ticket, admit), "Cache-Control": "no-cache"},
        )

    async def _relay(
        self,
        ticket: Ticket,
        admit: Admit,
        response: aiohttp.ClientResponse,
        handle: RunningHandle,
    ) -> AsyncIterator[bytes]:
        """Pass SSE bytes through as they arrive; account for them; end exactly once."""
        driver = self.state.driver
        scanner = SseScanner()
        ttft_s: float | None = None
        outcome = Outcome.COMPLETED
        ok = True
        handle.on_preempt = lambda _decision: response.close()
        try:
            try:
                async for data in response.content.iter_any():
                    if scanner.feed(data):
                        if ttft_s is None:
                            ttft_s = driver.now() - ticket.arrival
                        # Progress gates preemption of standard priorities (80% of max_tokens).
                        driver.progress(ticket.id, scanner.chunks)
                    yield data
            except (TimeoutError, aiohttp.ClientError):
                if handle.preempt is None:
                    ok, outcome = False, Outcome.UPSTREAM_ERROR
                    yield _error_event("upstream_error", "the engine's stream was cut off")
            if handle.preempt is not None:
                outcome = Outcome.PREEMPTED
                yield _preempted_chunk(self.endpoint, ticket.id)
            elif ok and not scanner.done:
                ok, outcome = scanner.chunks > 0, Outcome.UPSTREAM_ERROR
                yield _error_event("upstream_error", "the engine ended the stream early")
        except asyncio.CancelledError:
            outcome = Outcome.CANCELLED
            raise
        finally:
            handle.on_preempt = None
            response.close()
            completion = scanner.completion_tokens
            usage = Usage(
                scanner.prompt_tokens or ticket.prompt_tokens,
                completion if completion is not None else scanner.chunks,
                ttft_s=None if ttft_s is None else ttft_s - admit.queued_s,
                ok=ok,
            )
            self._finish(ticket, usage, outcome, ttft_s)
