"""The limit scripts of ``RedisStore``: their texts (``scripts/*.lua`` after a prelude,
read by ``script_text``, which reads the batch lane's scripts too), loading them into
Redis, running them by SHA1 (reloading those a restarted Redis lost), and the arguments
of ``sync.lua``, the one script whose ``ARGV`` has a layout of its own.

Memory pressure. Every script starts with ``#!lua flags=allow-oom`` (Redis ≥ 7.0, Valkey):
a Redis at its ``maxmemory`` refuses writes that could grow it (``-OOM``), and without
the flag it refuses a script's first such write, so batch data filling a shared Redis
took the limits with it (every replica fell back). The limits' own keys are bounded by
the configuration (waiting and running tickets, one bucket hash per tenant), not by
what tenants store, so letting them write past ``maxmemory`` costs at most that; batch
data stays refused (``batches/redis/scripts/*.lua`` have no flags line). A server that
refuses the flag (Redis 6.2) gets the scripts without it, once, with a warning: there
limits fall back while Redis is out of memory.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from sluicegate.store.order import encode_order
from sluicegate.store.resp import Arg, Pipelined
from sluicegate.store.store_errors import StoreSessionLostError, StoreUnavailableError
from sluicegate.store.types import Drop, GlobalCounts, ModelLimits, Offer, Refund, SyncResult

SCRIPT_FLAGS = "#!lua flags=allow-oom\n"
"""The first line of every script: it runs (and writes) while Redis is at ``maxmemory``."""
_PRELUDES = {
    "sync": "common",
    "heartbeat": "common",
    "resync": "common",
    "counts": "common",
    "live": "common",
    "work": "common",
    "take": "bucket",
    "refund": "bucket",
}
"""Each script and its prelude: ``common.lua`` (a model's keys) or ``bucket.lua``."""
_log = logging.getLogger("sluicegate.store")


@dataclass(slots=True)
class Script:
    """A Lua script and its SHA1 (what ``EVALSHA`` names it by)."""

    text: str
    sha: str


Call = tuple[Script, list[str], list[str | int | float]]
"""One script call: the script, its keys and its arguments."""


def script_text(package: str, name: str, *, prelude: str, flags: str = "") -> str:
    """The text of the script ``scripts/<name>.lua`` of ``package``: ``flags`` (a first
    line such as ``SCRIPT_FLAGS``; none by default), then ``scripts/<prelude>.lua``, then
    the script itself."""
    folder = resources.files(package).joinpath("scripts")
    head = folder.joinpath(f"{prelude}.lua").read_text(encoding="utf-8")
    return flags + head + folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")


def _script(text: str) -> Script:
    return Script(text, hashlib.sha1(text.encode()).hexdigest())


def _refused_flags(script: Script, reply: object) -> bool:
    """Whether ``reply`` to loading ``script`` is a server's refusal of its flags line."""
    return (
        isinstance(reply, ResponseError)
        and not isinstance(reply, NoScriptError)
        and script.text.startswith(SCRIPT_FLAGS)
        and ("shebang" in str(reply).lower() or "'#'" in str(reply) or "near '#'" in str(reply))
    )


def milliseconds(seconds: float | None) -> int:
    """Seconds as whole milliseconds for a script, ``None`` (never) as -1."""
    return -1 if seconds is None else max(0, math.ceil(seconds * 1000.0))


def sync_args(
    replica: str,
    ttl_ms: int,
    limits: ModelLimits,
    ops: Sequence[Offer | Drop | Refund],
    now_s: float,
    seq: int,
    joined: bool = False,
) -> list[str | int | float]:
    """``sync.lua``'s arguments for one model: its limits, the caller's wall clock
    ``now_s``, the sync's number ``seq``, whether the session ``joined`` (resynced: the
    store must know it), then its offers and drops in order (refunds go to ``refund.lua``).

    Raises:
        ValueError: an offer's lane is not in ``limits``, or a weight, charge, cost or
            correction is out of range.
    """
    fair = {lane.name: lane.fair for lane in limits.lanes}
    args: list[str | int | float] = [
        replica,
        ttl_ms,
        limits.cap,
        -1 if limits.token_budget is None else limits.token_budget,
        milliseconds(now_s),
        seq,
        int(joined),
        len(limits.lanes),
    ]
    for lane in limits.lanes:
        args += [lane.name, lane.cap, int(lane.borrow), int(lane.fair), int(lane.lend)]
        args.append(lane.shares or "-")
    model_ops = [op for op in ops if not isinstance(op, Refund)]
    args.append(len(model_ops))
    for op in model_ops:
        if isinstance(op, Offer):
            if op.lane not in fair:
                raise ValueError(f"offer {op.ticket!r}: lane {op.lane!r} is not in the limits")
            if not (0.0 < op.weight < math.inf and math.isfinite(op.vtc_charge)):
                raise ValueError(f"offer {op.ticket!r}: weight or charge out of range")
            if op.cost_tokens < 0:
                raise ValueError(f"offer {op.ticket!r}: negative cost")
            args += ["O", op.ticket, op.lane, op.tenant, float(op.weight), int(op.cost_tokens)]
            args += [float(op.vtc_charge), encode_order(op.order), int(op.priority)]
            args += [milliseconds(op.urgent_at), milliseconds(op.preempt_delay_s)]
            args.append(milliseconds(op.share_from))
        else:
            if not math.isfinite(op.vtc_correction):
                raise ValueError(f"drop {op.ticket!r}: the correction must be finite")
            args += ["D", op.ticket, float(op.vtc_correction)]
    return args


def sync_result(reply: list[Any]) -> SyncResult:
    """One model's answer to ``sync.lua``.

    Raises:
        StoreUnavailableError: the store applied a newer sync of this replica (``stale``).
    """
    if reply == ["stale"]:
        raise StoreUnavailableError("the store applied a newer sync of this replica")
    if reply == ["lost"]:
        raise StoreSessionLostError("the store does not know this replica's session")
    return SyncResult(
        granted=tuple(reply[0]),
        counts=GlobalCounts(
            running=int(reply[1]),
            inflight_tokens=int(reply[2]),
            waiting=int(reply[3]),
            replicas=int(reply[4]),
        ),
        stops=tuple(reply[5]),
    )


async def _pipeline(client: Pipelined, calls: Sequence[Call], deadline: float) -> list[Any]:
    commands: list[list[Arg]] = [
        ["EVALSHA", script.sha, len(keys), *keys, *args] for script, keys, args in calls
    ]
    return await client.execute(commands, deadline)


class LimitScripts:
    """The store's scripts by name, loaded into Redis and run there by SHA1 on the client
    that ``main()`` returns (it raises when the store is not connected)."""

    def __init__(self) -> None:
        self._by_name: dict[str, Script] = {}

    def __getitem__(self, name: str) -> Script:
        return self._by_name[name]

    def reset(self) -> None:
        """Read every script again, with its flags line (for a new connection)."""
        for name, prelude in _PRELUDES.items():
            text = script_text("sluicegate.store", name, prelude=prelude, flags=SCRIPT_FLAGS)
            self._by_name[name] = _script(text)

    async def load(
        self,
        main: Callable[[], Pipelined],
        deadline: float,
        scripts: Sequence[Script] | None = None,
    ) -> None:
        """Load ``scripts`` (default: all, as ``connect`` does, so that the first calls on a
        store that restarted empty do not pay ``NOSCRIPT`` and a load inside their own
        timeout) in one round trip. A server that refuses the flags line gets every
        script without it."""
        scripts = list(self._by_name.values()) if scripts is None else scripts
        loads: list[list[Arg]] = [["SCRIPT", "LOAD", script.text] for script in scripts]
        replies = await main().execute(loads, deadline)
        flagged = [s for s, r in zip(scripts, replies, strict=True) if _refused_flags(s, r)]
        if flagged:
            # A server without script flags (Redis < 7) reads the first line as Lua.
            _log.warning(
                "the shared store does not take script flags (Redis < 7.0?): while it is at "
                "its maxmemory, the limit scripts are refused and replicas fall back"
            )
            for script in self._by_name.values():
                script.text = script.text.removeprefix(SCRIPT_FLAGS)
                script.sha = hashlib.sha1(script.text.encode()).hexdigest()
            await self.load(main, deadline, flagged)
            return
        for script, sha in zip(scripts, replies, strict=True):
            if isinstance(sha, Exception):
                raise sha
            script.sha = sha

    async def run(
        self, main: Callable[[], Pipelined], calls: Sequence[Call], deadline: float
    ) -> list[Any]:
        """Run script calls in one pipeline; reload the scripts a restarted Redis lost and
        retry their calls. A reply that is an error is raised."""
        replies = await _pipeline(main(), calls, deadline)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            lost = {id(calls[index][0]): calls[index][0] for index in missing}
            await self.load(main, deadline, list(lost.values()))
            retried = await _pipeline(main(), [calls[index] for index in missing], deadline)
            for index, reply in zip(missing, retried, strict=True):
                replies[index] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies
