"""Multi-replica routing over real HTTP (DESIGN §8), measured by what each emulator admitted."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aiohttp

from tests.gateway.gateway_harness import (
    FAST_PRIORS,
    MODEL,
    Stack,
    backend_state,
    engine_config,
    engine_stats,
    model_state,
    open_stream,
    stack,
    wait_until,
)

TWO = f"""    max_concurrency: 32
    router: {{router}}
{FAST_PRIORS}    lanes:
      - {{{{name: interactive, max_concurrency: 32}}}}
"""
SMALL = {"model": MODEL, "prompt": "route me", "max_tokens": 2, "ignore_eos": True}
SYSTEM = "You are a meticulous assistant for the {team} team. " + "Follow the house style. " * 20


def _router(name: str, extra: str = "") -> str:
    return TWO.format(router=name) + extra


def _admitted(gateway: Stack) -> list[int]:
    return [int(engine_stats(gateway.engine_url(i))["admitted_total"]) for i in range(2)]


async def _post(session: aiohttp.ClientSession, gateway: Stack, body: object) -> None:
    async with session.post(gateway.base_url + "/v1/chat/completions", json=body) as reply:
        assert reply.status == 200, await reply.text()
        await reply.read()


async def _completions(gateway: Stack, count: int, concurrency: int) -> None:
    """``count`` short completions, ``concurrency`` at a time; each must succeed."""
    url = gateway.base_url + "/v1/completions"
    semaphore = asyncio.Semaphore(concurrency)

    async def one(session: aiohttp.ClientSession) -> None:
        async with semaphore, session.post(url, json=SMALL) as reply:
            assert reply.status == 200, await reply.text()
            await reply.read()

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session) for _ in range(count)))


def _chat(system: str, question: str) -> dict[str, object]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"model": MODEL, "messages": messages, "max_tokens": 2, "ignore_eos": True}


async def _groups(gateway: Stack, systems: Sequence[str], each: int) -> list[list[int]]:
    """Send ``each`` sequential chats per system prompt; per prompt, the admitted delta per
    engine."""
    splits: list[list[int]] = []
    async with aiohttp.ClientSession() as session:
        for system in systems:
            before = _admitted(gateway)
            for i in range(each):
                await _post(session, gateway, _chat(system, f"question {i}?"))
            after = _admitted(gateway)
            splits.append([a - b for a, b in zip(after, before, strict=True)])
    return splits


async def test_least_inflight_balances_200_requests_over_two_replicas() -> None:
    """``least_inflight`` spreads 200 short requests (16 concurrent) over two equal replicas
    evenly: each gets between 45% and 55% of them."""
    with stack(_router("least_inflight"), engines=2) as gateway:
        await _completions(gateway, 200, 16)
        admitted = _admitted(gateway)
    assert sum(admitted) == 200
    # Within 5 points of an even split: it balances in-flight load, so an engine slowed by a
    # busy test machine may take a few requests fewer.
    assert all(90 <= count <= 110 for count in admitted), admitted


async def test_weighted_round_robin_splits_one_to_three() -> None:
    """``round_robin`` with weights 1:3 sends exactly a quarter of 100 requests (8 concurrent)
    to the light replica: smooth weighted round robin picks each backend ``w_i`` times in
    every ``W`` consecutive choices."""
    with stack(_router("round_robin"), engines=2, weights=(1.0, 3.0)) as gateway:
        await _completions(gateway, 100, 8)
        admitted = _admitted(gateway)
    assert admitted == [25, 75]


async def test_prefix_affinity_keeps_a_shared_system_prompt_on_one_replica() -> None:
    """With ``prefix_affinity``, sequential chats sharing a long system prompt all go to the
    same replica (eight system prompts, five chats each), and the prompts as a set use both
    replicas."""
    systems = [SYSTEM.format(team=team) for team in "ABCDEFGH"]
    with stack(_router("prefix_affinity"), engines=2) as gateway:
        splits = await _groups(gateway, systems, 5)
    assert all(sorted(split) == [0, 5] for split in splits), splits
    homes = {split.index(5) for split in splits}
    assert homes == {0, 1}, splits


async def test_least_inflight_does_not_keep_a_prefix_together() -> None:
    """The contrast that makes the affinity test meaningful: ``least_inflight`` alternates
    sequential chats that share a system prompt over both replicas."""
    with stack(_router("least_inflight"), engines=2) as gateway:
        splits = await _groups(gateway, [SYSTEM.format(team="A")], 6)
    assert splits == [[3, 3]]


async def test_prefix_affinity_spills_over_when_the_home_replica_is_over_its_bound() -> None:
    """Four concurrent streams with one prefix: the bounded-load rule
    (``inflight + 1 <= ceil(1.25 * (total + 1) / 2)``) keeps three on the home replica and
    sends the third one to the other, rather than all four home or two and two."""
    prompt = SYSTEM.format(team="spill")
    with stack(_router("prefix_affinity"), engines=2) as gateway:
        async with aiohttp.ClientSession() as session:
            streams = [
                await open_stream(session, gateway.base_url, prompt=prompt) for _ in range(4)
            ]
            inflight = sorted(b["inflight"] for b in model_state(gateway.base_url)["backends"])
            for stream in streams:
                stream.close()
    assert inflight == [1, 3]


async def test_least_expected_time_prefers_the_replica_whose_engine_is_idle() -> None:
    """With ``least_expected_time``, when one engine has a queue of its own (traffic the
    gateway did not send: scraped ``num_requests_waiting`` > 0) and the gateway has nothing
    in flight on either, every new request goes to the other, idle engine."""
    scrape = "server: {scrape_interval_s: 0.2}\n"
    two_seqs = engine_config(max_num_seqs=2)
    with stack(_router("least_expected_time", scrape), engines=2, engine=two_seqs) as gateway:
        async with aiohttp.ClientSession() as session:
            direct = [await open_stream(session, gateway.engine_url(0), events=0) for _ in range(4)]
            busy = await asyncio.to_thread(
                wait_until,
                lambda: (backend_state(gateway.base_url, "e0")["num_requests_waiting"] or 0) > 0,
                2.0,
            )
            before = _admitted(gateway)
            await _completions(gateway, 10, 1)
            after = _admitted(gateway)
            for stream in direct:
                stream.close()
    assert busy
    assert [a - b for a, b in zip(after, before, strict=True)] == [0, 10]
