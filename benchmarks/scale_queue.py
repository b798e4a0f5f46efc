"""The waiting queue of ``bench_scale.py``: requests parked in the gateway's ``hold`` lane
(open HTTP connections waiting their turn behind one that runs for 1,000 s), signed by
the tenants' keys, and the queue depth the gateway reports."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from livestack import gauge

HOLD = "hold"
HOLD_TOKENS = 100_000


def key(i: int) -> str:
    """The API key of tenant ``i`` (only ever in this process's environment)."""
    return f"bench-scale-key-{i:04d}"


class Holder:
    """Parks requests in the ``hold`` lane: open connections that wait for their turn."""

    def __init__(self, url: str, tenants: int) -> None:
        self._url = url + "/v1/chat/completions"
        self._tenants = tenants
        self._tasks: set[asyncio.Task[None]] = set()
        connector = aiohttp.TCPConnector(limit=0)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None)
        )
        self._body = orjson.dumps(
            {"model": HOLD, "messages": [{"role": "user", "content": "wait"}],
             "max_tokens": HOLD_TOKENS, "ignore_eos": True}
        )  # fmt: skip

    @property
    def held(self) -> int:
        """Requests sent and not answered."""
        return len(self._tasks)

    async def _one(self, tenant: int) -> None:
        headers = {"Authorization": f"Bearer {key(tenant)}", "Content-Type": "application/json"}
        try:
            async with self._session.post(self._url, data=self._body, headers=headers) as r:
                await r.read()
        except aiohttp.ClientError:
            pass

    async def fill(self, total: int, rate: float) -> None:
        """Send requests, paced at ``rate``/s, until ``total`` are outstanding."""
        loop = asyncio.get_running_loop()
        start, sent = loop.time(), 0
        while self.held < total:
            delay = start + sent / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(self._one(sent % self._tenants))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            sent += 1

    async def close(self) -> None:
        """Hang up every parked request."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._session.close()


async def waiting(url: str) -> int:
    """Requests the gateway has waiting in the ``hold`` lane."""
    async with aiohttp.ClientSession() as session:
        return round(await gauge(session, url, "sluicegate_queue_depth", model=HOLD))


async def wait_for_depth(url: str, depth: int, timeout_s: float) -> int:
    """Poll until exactly ``depth`` requests wait in ``hold`` (or the timeout); the depth
    seen last."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    seen = await waiting(url)
    while seen != depth and loop.time() < deadline:
        await asyncio.sleep(0.25)
        seen = await waiting(url)
    return seen
