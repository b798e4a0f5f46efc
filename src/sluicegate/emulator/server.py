"""The emulator's HTTP face: an OpenAI-compatible API over the real-time engine.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``,
``POST /v1/embeddings`` (``embeddings.py``), ``GET /v1/models``, the health and metrics
paths and any documents of its personality (``personalities/``: vLLM by default, or
SGLang, TGI, TensorRT-LLM, llama-server: their metric names, endpoints, error shapes and
stream quirks), and ``GET /emulator/stats`` (JSON, for tests and demos).

Prompt size: there is no tokenizer, so a prompt of ``c`` characters counts as
``max(1, ceil(c / 4))`` tokens (OpenAI's rule of thumb for English); for chat,
``c`` sums the text of every message (string content or ``{"type": "text"}``
parts); a completions prompt given as token ids counts one token per id.

A client that disconnects (streaming or not) aborts its request in the engine
at once, freeing its KV, as vLLM does.

``n`` > 1 choices run as vLLM runs them: ``n`` sequences side by side in the engine
(each prefilling the prompt, a simplification: vLLM shares it), streamed interleaved as
their tokens come, each chunk naming its choice's ``index``; one usage covers them all
(the prompt once, every choice's tokens).

Prefix caching (vLLM's automatic prefix caching, on unless ``prefix_caching=False``, the
``--no-enable-prefix-caching`` equivalent): a completion's prompt text is cut into the
engine's KV blocks and hashed (``core.prefix_blocks.block_hashes``, 4 characters a
token, as the gateway hashes it), and the engine skips the prefill of the leading blocks
it still caches. ``kv_events`` publishes the cache's stores and evictions as vLLM's KV
events (``kv_event_publisher``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sluicegate.calibrate.preset_file import load_engine_config
from sluicegate.core.prefix_blocks import block_hashes
from sluicegate.emulator.embeddings import embeddings_body, parse_embeddings
from sluicegate.emulator.event_stream import EventStreamResponse, on_disconnect
from sluicegate.emulator.kv_event_publisher import KvEventPublisher, KvEventsOptions
from sluicegate.emulator.openai_wire import (
    CHARS_PER_TOKEN,
    ApiError,
    CompletionRequest,
    OpenAIShape,
    parse_request,
)
from sluicegate.emulator.personalities import EngineMetrics, JsonDocument, Personality, personality
from sluicegate.emulator.runner import (
    ChoiceEvents,
    EngineRunner,
    Finish,
    FinishReason,
    RequestStream,
)
from sluicegate.engine import Engine, EngineConfig
from sluicegate.engine.engine_config import parse_scheduling_policy


def _json(payload: object, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


class _EmulatorApi:
    """The route handlers, bound to one engine runner and its metrics."""

    def __init__(
        self,
        runner: EngineRunner,
        metrics: EngineMetrics,
        model: str,
        max_model_len: int,
        persona: Personality,
        block_tokens: int | None,
    ) -> None:
        self._runner = runner
        self._block_tokens = block_tokens
        self._metrics = metrics
        self._persona = persona
        self._model = model
        self._max_model_len = max_model_len
        self._created = int(time.time())
        self._next_id = 0

    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        return await self._complete(request, chat=True)

    async def completions(self, request: Request) -> Response:
        """``POST /v1/completions``."""
        return await self._complete(request, chat=False)

    async def embeddings(self, request: Request) -> Response:
        """``POST /v1/embeddings``: each input a prefill-only request in the engine
        (``embeddings.py``)."""
        streams: list[RequestStream] = []
        try:
            inputs, dims = parse_embeddings(await request.body(), self._model)
            await self._runner.request_overhead()
            base = self._request_id(request)
            for i, (_, tokens) in enumerate(inputs):
                streams.append(self._submit(f"{base}-{i}", tokens, 1, param="input"))
        except ApiError as exc:
            for stream in streams:
                self._runner.abort(stream.req_id)
            return self._error(exc)

        def abort_all() -> None:
            for stream in streams:
                self._runner.abort(stream.req_id)

        watcher = asyncio.create_task(on_disconnect(request.receive, abort_all))
        try:
            for stream in streams:
                while not isinstance(event := await stream.next_event(), Finish):
                    pass
                if event.reason is FinishReason.ABORT:
                    return Response(status_code=499)
        finally:
            watcher.cancel()
            abort_all()
        prompt = sum(stream.prompt_tokens for stream in streams)
        body = embeddings_body(self._model, [key for key, _ in inputs], dims, prompt)
        return Response(body, media_type="application/json")

    async def models(self, request: Request) -> Response:
        """``GET /v1/models``: the one served model."""
        card = {
            "id": self._model, "object": "model", "created": self._created,
            "owned_by": "sluicegate-emulator", "max_model_len": self._max_model_len,
        }  # fmt: skip
        return _json({"object": "list", "data": [card]})

    async def health(self, request: Request) -> Response:
        """The personality's health path: 200 while the process serves."""
        body = self._persona.health_body()
        if body is not None:
            return _json(body)
        return Response(status_code=200)

    async def metrics(self, request: Request) -> Response:
        """The personality's metrics path: Prometheus text with its engine's names, gzipped
        for a client that accepts it where the engine's exporter does so."""
        page = self._metrics.render()
        if self._persona.gzip_metrics and "gzip" in request.headers.get("accept-encoding", ""):
            headers = {"content-encoding": "gzip", "vary": "Accept-Encoding"}
            return Response(
                gzip.compress(page), headers=headers, media_type=self._metrics.content_type
            )
        return Response(page, media_type=self._metrics.content_type)

    def _error(self, exc: ApiError) -> Response:
        """A refusal in the personality's own error shape."""
        body = self._persona.error_body(exc.status, exc.message, exc.code, exc.param)
        return _json(body, self._persona.error_status(exc.status, exc.code))

    async def stats(self, request: Request) -> Response:
        """``GET /emulator/stats``: engine state and request counters as JSON."""
        return _json(dataclasses.asdict(self._runner.stats()))

    async def _complete(self, request: Request, *, chat: bool) -> Response:
        streams: list[RequestStream] = []
        try:
            parsed = parse_request(await request.body(), chat=chat, model=self._model)
            await self._runner.request_overhead()
            req_id = self._request_id(request)
            prefix = self._prefix(parsed)
            for index in range(parsed.n):
                streams.append(
                    self._submit(
                        req_id if index == 0 else f"{req_id}-n{index}",
                        parsed.prompt_tokens,
                        parsed.max_tokens,
                        ignore_eos=parsed.ignore_eos,
                        priority=parsed.priority,
                        prefix=prefix,
                        param="messages" if chat else "prompt",
                    )
                )
        except ApiError as exc:
            for stream in streams:
                self._runner.abort(stream.req_id)
            return self._error(exc)
        shape = OpenAIShape(
            chat=chat, resp_id=("chatcmpl-" if chat else "cmpl-") + req_id,
            model=self._model, created=int(time.time()),
        )  # fmt: skip
        if parsed.stream:
            return EventStreamResponse(
                self._runner, streams, shape, parsed.include_usage, self._persona.keepalive_s
            )
        answers = await self._collect(request, streams)
        if answers is None:
            return Response(status_code=499)  # nobody is listening any more
        completion = sum(stream.completion_tokens for stream in streams)
        return _json(shape.body(answers, streams[0].prompt_tokens, completion))

    def _prefix(self, parsed: CompletionRequest) -> tuple[int, ...]:
        """The hashes of the prompt's full KV blocks, for prefix caching (none when off)."""
        if self._block_tokens is None:
            return ()
        full = parsed.prompt_tokens // self._block_tokens
        return block_hashes(parsed.text, self._block_tokens, CHARS_PER_TOKEN, limit=full)

    def _request_id(self, request: Request) -> str:
        """The client's ``X-Request-Id`` (as vLLM honours it), else a sequence number."""
        given = request.headers.get("x-request-id")
        if given:
            if self._runner.is_live(given):
                raise ApiError(400, f"request id {given!r} is already in use", "duplicate_id")
            return given
        self._next_id += 1
        return f"{self._next_id:012d}"

    def _submit(
        self,
        req_id: str,
        prompt_tokens: int,
        max_tokens: int,
        *,
        ignore_eos: bool = True,
        priority: int = 0,
        prefix: tuple[int, ...] = (),
        param: str,
    ) -> RequestStream:
        try:
            return self._runner.submit(
                req_id, prompt_tokens, max_tokens,
                ignore_eos=ignore_eos, priority=priority, prefix=prefix,
            )  # fmt: skip
        except ValueError as exc:
            message = f"This request is too long for the emulated engine: {exc}"
            raise ApiError(400, message, "context_length_exceeded", param) from exc

    async def _collect(
        self, request: Request, streams: list[RequestStream]
    ) -> list[tuple[str, str]] | None:
        """Wait for a non-streamed request's end: each choice's (text, finish reason); None
        when it was aborted (all of it, if the client disconnects)."""

        def abort_all() -> None:
            for stream in streams:
                self._runner.abort(stream.req_id)

        watcher = asyncio.create_task(on_disconnect(request.receive, abort_all))
        texts: list[list[str]] = [[] for _ in streams]
        reasons: list[str] = ["" for _ in streams]
        choices = ChoiceEvents(streams)
        try:
            for _ in range(len(streams)):
                while True:
                    index, event = await choices.next()
                    if isinstance(event, Finish):
                        break
                    texts[index].append(event.text)
                if event.reason is FinishReason.ABORT:
                    return None
                reasons[index] = event.reason
            return [("".join(parts), reason) for parts, reason in zip(texts, reasons, strict=True)]
        finally:
            watcher.cancel()
            choices.close()
            abort_all()


def _document(build: JsonDocument) -> Callable[[Request], Awaitable[Response]]:
    async def answer(request: Request) -> Response:
        return _json(build())

    return answer


def build_app(
    config: EngineConfig,
    *,
    model: str,
    seed: int = 0,
    persona: str = "vllm",
    prefix_caching: bool = True,
    kv_events: KvEventsOptions | None = None,
) -> Starlette:
    """The emulator as an ASGI app: one engine, stepped in real time while the app runs.

    Args:
        config: the engine to emulate (see ``sluicegate.engine.presets``).
        model: the model name served (requests naming another get 404).
        seed: seeds output lengths and fake text; same seed and ids, same responses.
        persona: the engine it looks like (``personalities.PERSONALITIES``).
        prefix_caching: cache prompts' KV blocks and skip the prefill of cached leading
            blocks (vLLM's automatic prefix caching); no effect on a ``batch_independent``
            engine, which models no shared KV.
        kv_events: publish the prefix cache's changes as vLLM's KV events
            (``app.state.kv_events`` is the publisher, its sockets bound at startup).

    Raises:
        KeyError: unknown personality.
        ValueError: ``kv_events`` without prefix caching, or on a ``batch_independent``
            engine (there would be no events to publish).
    """
    if kv_events is not None and (not prefix_caching or config.batch_independent):
        raise ValueError(
            "KV events need prefix caching on an engine with a shared KV cache "
            "(drop --no-prefix-caching, or use a preset that is not batch_independent)"
        )
    played = personality(persona)
    engine = Engine(config, seed=seed)
    metrics = played.metrics(model, engine)
    publisher = None if kv_events is None else KvEventPublisher(kv_events, engine)
    after_step = None if publisher is None else publisher.after_step
    runner = EngineRunner(engine, metrics, seed=seed, after_step=after_step)
    block_tokens = config.block_size if prefix_caching else None
    max_model_len = config.num_blocks * config.block_size
    api = _EmulatorApi(runner, metrics, model, max_model_len, played, block_tokens)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if publisher is not None:
            publisher.start()
        runner.start()
        try:
            yield
        finally:
            await runner.stop()
            if publisher is not None:
                await publisher.stop()

    routes = [
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/embeddings", api.embeddings, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route(played.health_path, api.health, methods=["GET"]),
        Route(played.metrics_path, api.metrics, methods=["GET"]),
        Route("/emulator/stats", api.stats, methods=["GET"]),
        *(
            Route(path, _document(build), methods=["GET"])
            for path, build in played.documents(model, engine).items()
        ),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.kv_events = publisher
    return app


def serve(
    host: str,
    port: int,
    *,
    preset: str,
    model: str,
    max_num_seqs: int | None = None,
    seed: int = 0,
    persona: str = "vllm",
    scheduling_policy: str = "fcfs",
    prefix_caching: bool = True,
    kv_events: KvEventsOptions | None = None,
) -> None:
    """Serve an engine preset over the OpenAI API until interrupted (``sluicegate emulate``).

    Args:
        host: interface to bind.
        port: TCP port to bind.
        preset: engine preset name (``sluicegate.engine.PRESETS``) or preset file path.
        model: the model name to serve.
        max_num_seqs: overrides the preset's running-batch size.
        seed: seeds output lengths and fake text.
        persona: the engine it looks like (``personalities.PERSONALITIES``).
        scheduling_policy: vLLM's ``--scheduling-policy``, ``fcfs`` or ``priority``.
        prefix_caching: vLLM's automatic prefix caching (``build_app``).
        kv_events: publish KV cache events (``build_app``).

    Raises:
        KeyError: unknown personality.
        ValueError: an unknown preset or a bad preset file, ``max_num_seqs`` out of
            range, an unknown ``scheduling_policy``, or ``kv_events`` without prefix
            caching.
    """
    config = dataclasses.replace(
        load_engine_config(preset), scheduling_policy=parse_scheduling_policy(scheduling_policy)
    )
    if max_num_seqs is not None:
        config = dataclasses.replace(config, max_num_seqs=max_num_seqs)
    app = build_app(
        config, model=model, seed=seed, persona=persona,
        prefix_caching=prefix_caching, kv_events=kv_events,
    )  # fmt: skip
    uvicorn.run(
        app, host=host, port=port, loop="uvloop", http="httptools", ws="none",
        log_level="warning", access_log=False,
    )  # fmt: skip
