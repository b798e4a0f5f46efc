"""sluicegate in front of the real engine: a gateway in a thread, configured with one
``llamacpp`` backend, and a request that holds the engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager

import aiohttp
import openai
from openai.types import Completion

from sluicegate.config import parse_config
from sluicegate.gateway.app import build_app
from tests.gateway.gateway_harness import ADMIN_KEY, MODEL, Stack, serve_in_thread
from tests.realengine.realengine_client import completion_body


def backend_config(engine_port: int, body: str = "", *, max_concurrency: int | None = 1) -> str:
    """Gateway YAML for model ``tiny`` on one ``llamacpp`` backend at ``engine_port``.

    ``body`` is appended under the model (model keys indented by four spaces)
    and may end with top-level keys such as ``server:``.
    """
    cap = "" if max_concurrency is None else f", max_concurrency: {max_concurrency}"
    backend = f"{{name: llama, url: 'http://127.0.0.1:{engine_port}', engine: llamacpp{cap}}}"
    return f"models:\n  - name: {MODEL}\n    backends:\n      - {backend}\n{body}"


@contextmanager
def gateway_on(
    engine_port: int, body: str = "", *, max_concurrency: int | None = 1, scrape: bool = True
) -> Iterator[Stack]:
    """A gateway in a thread in front of the engine at ``engine_port``."""
    config = parse_config(backend_config(engine_port, body, max_concurrency=max_concurrency))
    app = build_app(config, environ={"SLUICEGATE_ADMIN_KEY": ADMIN_KEY}, scrape=scrape)
    with serve_in_thread(app) as port:
        yield Stack(port, (engine_port,), config)


GatewayFactory = Callable[..., AbstractContextManager[Stack]]


async def hold_engine(session: aiohttp.ClientSession, gateway: Stack) -> aiohttp.ClientResponse:
    """A long stream through the gateway, admitted and generating when this returns."""
    body = completion_body("hold the engine", 3000, stream=True)
    response = await session.post(gateway.base_url + "/v1/completions", json=body)
    assert response.status == 200, await response.read()
    while not (await response.content.readline()).startswith(b"data:"):
        pass
    return response


@asynccontextmanager
async def held_with_a_waiter(
    gateway: Stack, prompt: str, max_tokens: int
) -> AsyncIterator[tuple[aiohttp.ClientResponse, asyncio.Future[Completion]]]:
    """A stream holding the engine (``hold_engine``), then an SDK completion of ``prompt``
    sent behind it, which waits in the gateway: the stream and the completion's future."""
    client = openai.AsyncOpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0)
    async with aiohttp.ClientSession() as session, client:
        holder = await hold_engine(session, gateway)
        waiting = asyncio.ensure_future(
            client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens)
        )
        yield holder, waiting
