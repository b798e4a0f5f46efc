"""Phase 4 of the distributed benchmark: Redis memory per waiting ticket (``INFO memory``),
each count of tickets parked in turn behind the held slot of the cap-1 model ``h`` in the
one-replica fleet ``one``."""

from __future__ import annotations

import argparse
import asyncio
import math
import time

import aiohttp
from redis.asyncio import Redis
from rich.console import Console

from distributed_load import client_session, park
from distributed_stack import Bench, fleet_keys, store_counters
from tables import Grid, cells

HOLD_FOR_PARKING_TOKENS = 6000  # 60 s on the ``independent`` engine
WAIT_TOKENS = 1
QUEUE_KEY = "{one:h}:q:interactive"


async def sizing(bench: Bench, args: argparse.Namespace, console: Console) -> Grid:
    """Phase 4: Redis memory per waiting ticket, each of ``args.parked`` tickets parked in
    turn in ``one`` (after the previous ones left and the store emptied)."""
    redis = Redis.from_url(bench.redis.url)
    rows = []
    async with client_session(600.0) as session:
        for n in args.parked:
            deadline = time.monotonic() + 30.0
            while await redis.zcard(QUEUE_KEY) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            with console.status(f"parking {n} tickets…"):
                rows.append(await _park_row(bench, redis, session, n, args.park_rate))
    await redis.aclose()
    headers = "parked|in the lane's sorted set|replica sessions in the "
    headers += "store|store fallbacks|to park s|used_memory before MiB|after MiB|"
    headers += "bytes per sorted-set entry|the fleet's keys"
    return "Redis memory per waiting ticket (INFO memory used_memory)", cells(headers), rows


async def _park_row(
    bench: Bench, redis: Redis, session: aiohttp.ClientSession, n: int, rate: float
) -> list[str]:
    """Hold ``h``'s slot in ``one``, park ``n`` tickets behind it, wait until the lane's sorted
    set holds exactly ``n`` (or 20 s more than the parking takes), measure, let them go."""
    holder = bench.handoff_target("one", 0, HOLD_FOR_PARKING_TOKENS)
    waiter = bench.handoff_target("one", 0, WAIT_TOKENS)
    hold = asyncio.create_task(park(session, holder, 1, 1.0))
    await asyncio.sleep(1.0)
    before = (await redis.info("memory"))["used_memory"], await fleet_keys(redis, "one")
    _, falls = await store_counters(session, bench.fleets["one"])
    started = time.monotonic()
    parked = asyncio.create_task(park(session, waiter, n, rate))
    queued = 0
    while queued != n and time.monotonic() - started < n / rate + 20.0:
        await asyncio.sleep(0.2)
        queued = int(await redis.zcard(QUEUE_KEY))
    park_s = time.monotonic() - started
    after = (await redis.info("memory"))["used_memory"], await fleet_keys(redis, "one")
    sessions = await redis.zcard("{one:h}:replicas")
    falls = (await store_counters(session, bench.fleets["one"]))[1] - falls
    for task in (parked, hold):
        task.cancel()
    await asyncio.gather(parked, hold, return_exceptions=True)
    per_entry = (after[0] - before[0]) / queued if queued else math.nan
    row = [str(n), str(queued), str(sessions), f"{falls:.0f}", f"{park_s:.1f}"]
    row += [f"{before[0] / 2**20:.2f}", f"{after[0] / 2**20:.2f}", f"{per_entry:.0f}"]
    return [*row, f"{before[1]} → {after[1]}"]
