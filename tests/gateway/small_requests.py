"""A small completion timed from the client, and a request queued behind a stream that
holds the model's only slot: what the overload, clock and admin tests send to a one-slot
gateway."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

import aiohttp

from tests.gateway.gateway_harness import (
    MODEL,
    Reply,
    Stack,
    http_call,
    model_state,
    open_stream,
    wait_until,
)

T = TypeVar("T")
SMALL = {"model": MODEL, "prompt": "hi", "max_tokens": 3, "ignore_eos": True}


def post_small(gateway: Stack, key: str | None = None) -> tuple[float, Reply]:
    """POST a short completion; (seconds it took, the reply)."""
    start = time.monotonic()
    reply = http_call(gateway.base_url, "POST", "/v1/completions", json=SMALL, key=key)
    return time.monotonic() - start, reply


async def queue_behind_stream(
    session: aiohttp.ClientSession,
    gateway: Stack,
    post: Callable[[Stack], T],
    **stream: Any,
) -> tuple[aiohttp.ClientResponse, asyncio.Future[T], bool]:
    """A stream (``open_stream`` with ``stream`` options) takes the model's only slot, then
    ``post(gateway)`` runs in a thread: the stream (close it to free the slot), the post's
    future, and whether the post was seen waiting in the queue within 2 s."""
    holder = await open_stream(session, gateway.base_url, **stream)
    waiting = asyncio.ensure_future(asyncio.to_thread(post, gateway))
    queued = await asyncio.to_thread(
        wait_until, lambda: model_state(gateway.base_url)["queued"] == 1, 2.0
    )
    return holder, waiting, queued
