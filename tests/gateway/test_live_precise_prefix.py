"""``precise_prefix`` routing over real HTTP: requests follow the engine whose KV events
announced their prompt's blocks (DESIGN §8).

Two emulators behind a gateway in this process. The KV events are fed to the gateway's
own scheduler (``Scheduler.observe_kv_events``, what the gateway's subscriber calls), with
the block hashes the gateway itself computes from a body (``prompt_text`` and
``block_hashes`` of ``core/prefix_blocks``). They are fed only while no request is in
flight: the scheduler belongs to the gateway's event loop thread, which reads a block
index only when it routes a request.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
import orjson

from sluicegate.core.kv_index import AllBlocksCleared, BlockStored, KvEvent
from sluicegate.core.prefix_blocks import block_hashes, prompt_text
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import BackendSpec, ModelSpec
from sluicegate.emulator import build_app as build_emulator
from sluicegate.engine import preset
from sluicegate.gateway.app import build_app as build_gateway
from sluicegate.gateway.request.classify import parse_body, prompt_block_hashes
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    FAST_PRIORS,
    MODEL,
    RunningServer,
    Stack,
    engine_stats,
    gateway_config,
    model_state,
    open_stream,
    start_server,
    stop_servers,
)

SYSTEM = "You are a meticulous assistant for the {team} team. " + "Follow the house style. " * 20


def _config(recent_ttl_s: float) -> str:
    return (
        "    max_concurrency: 32\n"
        "    router: precise_prefix\n"
        f"    prefix_routing: {{recent_ttl_s: {recent_ttl_s}}}\n"
        f"{FAST_PRIORS}"
        "    lanes:\n"
        "      - {name: interactive, max_concurrency: 32}\n"
    )


@contextmanager
def gateway_over_two(recent_ttl_s: float) -> Iterator[tuple[Stack, Scheduler]]:
    """Two emulators and a ``precise_prefix`` gateway before them; its scheduler."""
    running: list[RunningServer] = []
    try:
        for seed in range(2):
            running.append(start_server(build_emulator(preset("tiny"), model=MODEL, seed=seed)))
        ports = [one.port for one in running]
        config = gateway_config(ports, _config(recent_ttl_s))
        app = build_gateway(config, environ={"SLUICEGATE_ADMIN_KEY": ADMIN_KEY})
        running.append(start_server(app))
        yield Stack(running[-1].port, tuple(ports), config), app.gateway.driver.scheduler
    finally:
        stop_servers(running)


def _chat(system: str, question: str) -> dict[str, object]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"model": MODEL, "messages": messages, "max_tokens": 2, "ignore_eos": True}


def _blocks(body: dict[str, object]) -> tuple[int, ...]:
    """The blocks an engine caching ``body``'s prompt announces (the model's defaults:
    16 tokens of 4 characters)."""
    return block_hashes(prompt_text(body), 16, 4)


def _feed(scheduler: Scheduler, engine: int, events: list[KvEvent]) -> None:
    scheduler.observe_kv_events(MODEL, f"e{engine}", events, max_blocks=100_000)


def _admitted(gateway: Stack) -> list[int]:
    return [int(engine_stats(gateway.engine_url(i))["admitted_total"]) for i in range(2)]


async def _split(gateway: Stack, system: str, count: int) -> list[int]:
    """Send ``count`` sequential chats with ``system`` (each its own question): how many
    each engine admitted."""
    before = _admitted(gateway)
    async with aiohttp.ClientSession() as session:
        for i in range(count):
            body = _chat(system, f"question {i}?")
            async with session.post(gateway.base_url + "/v1/chat/completions", json=body) as reply:
                assert reply.status == 200, await reply.text()
                await reply.read()
    return [a - b for a, b in zip(_admitted(gateway), before, strict=True)]


async def test_chats_go_to_the_engine_that_announced_their_prompt() -> None:
    """Engine 1 announced prompt A's blocks and engine 0 prompt B's: four chats of A (each
    with its own question after the shared system prompt) all run on engine 1, four of B
    on engine 0. When engine 1 clears its cache and engine 0 announces A, A's next four
    follow to engine 0. The router's own record is off (``recent_ttl_s: 0``), so only the
    events decide; least in-flight would split each four 2:2."""
    a, b = SYSTEM.format(team="A"), SYSTEM.format(team="B")
    with gateway_over_two(recent_ttl_s=0.0) as (gateway, scheduler):
        _feed(scheduler, 1, [BlockStored(_blocks(_chat(a, "question 0?")))])
        _feed(scheduler, 0, [BlockStored(_blocks(_chat(b, "question 0?")))])
        first_a = await _split(gateway, a, 4)
        first_b = await _split(gateway, b, 4)
        _feed(scheduler, 1, [AllBlocksCleared()])
        _feed(scheduler, 0, [BlockStored(_blocks(_chat(a, "question 0?")))])
        moved_a = await _split(gateway, a, 4)
    assert (first_a, first_b, moved_a) == ([0, 4], [4, 0], [4, 0])


async def test_concurrent_siblings_land_together_before_any_event() -> None:
    """No engine announced anything: four concurrent streams of one long prompt all run on
    one engine, by the router's record of where it sent the first (``recent_ttl_s: 2``);
    with the record off they spread by load, two and two."""
    prompt = SYSTEM.format(team="siblings")
    split = {}
    for ttl in (2.0, 0.0):
        with gateway_over_two(recent_ttl_s=ttl) as (gateway, _):
            async with aiohttp.ClientSession() as session:
                streams = [
                    await open_stream(session, gateway.base_url, prompt=prompt) for _ in range(4)
                ]
                backends = model_state(gateway.base_url)["backends"]
                split[ttl] = sorted(b["inflight"] for b in backends)
                for stream in streams:
                    stream.close()
    assert split == {2.0: [0, 4], 0.0: [2, 2]}


def test_the_gateway_hashes_prompts_only_for_precise_prefix_models() -> None:
    """A ``precise_prefix`` model's ticket carries the body's block hashes, cut by its
    ``prefix_routing``; any other model's none (the hashing is not paid for)."""
    body = _chat(SYSTEM.format(team="H"), "why?")
    parsed = parse_body(orjson.dumps(body), "chat")
    backends = (BackendSpec(name="b"),)
    precise = ModelSpec(
        name="m", backends=backends, router="precise_prefix", prefix_routing={"block_tokens": 8}
    )
    assert prompt_block_hashes(parsed, precise) == block_hashes(prompt_text(body), 8, 4)
    assert len(prompt_block_hashes(parsed, precise)) == len(prompt_text(body)) // 32 > 10
    for other in ("least_inflight", "prefix_affinity"):
        plain = ModelSpec(name="m", backends=backends, router=other)
        assert prompt_block_hashes(parsed, plain) == ()
