"""The Lua scripts of ``RedisBatches``: every change of a batch's or a line's state.

Each script (``scripts/<name>.lua``, after ``scripts/prelude.lua``, read by the shared
store's ``script_text``) runs atomically in Redis, so a status moves from one value to
the next in exactly one replica (a compare-and-set on the status), and a line's first
result wins (``HSETNX``). ``KEYS[1]`` is the base of every batch key,
``{<prefix>:batch}:`` (one hash tag: every key is in one slot, so a script may build the
names of the keys it touches from the base). The key layout is described in
``redis_batches``.

The scripts have no flags line (the limit scripts have ``allow-oom``): a Redis at its
``maxmemory`` refuses a script's first write that could grow it, so batch data stops
there and the limits go on (``store/lua.py``).
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.typing import EncodableT

from sluicegate.store.lua import script_text

NAMES = (
    "create",
    "delete_file",
    "cancel",
    "claim",
    "renew",
    "record",
    "begin_check",
    "end_check",
    "begin_end",
    "end",
    "reserve",
    "release",
    "purge_batch",
)
"""Every script, by the name of its file."""


class BatchScripts:
    """Every script, registered on ``client`` (redis-py loads one that Redis lacks when it
    is first run) and run with ``base`` as ``KEYS[1]``."""

    def __init__(self, client: aioredis.Redis, base: str) -> None:
        self.base = base
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(
                script_text("sluicegate.batches.redis", name, prelude="prelude")
            )
            for name in NAMES
        }

    async def run(self, name: str, *args: EncodableT) -> Any:
        """Run the script ``name`` with these ``ARGV``; its reply."""
        return await self._scripts[name](keys=[self.base], args=list(args))
