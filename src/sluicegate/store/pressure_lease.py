"""``PressureLease``: one pressure poller per fleet, elected in the shared store (DESIGN §16).

With a shared store, one replica polls Prometheus for the cluster pressure
(``gateway/ops/pressure_loop.py``) and publishes the stage it computed; the others read
it. Two keys under the hash tag ``{<prefix>}`` (one slot, so each script's keys are
declared and together):

==============================  ======  ================================================
key                             type    holds
==============================  ======  ================================================
``{<prefix>}:pressure:poller``  STRING  the holder's replica id; expires ``lease_s`` after
                                        its last renewal
``{<prefix>}:pressure:stage``   HASH    ``stage``: the holder's last ``PublishedStage``
                                        (JSON); ``at``: when (Redis ``TIME``, ms); expires
                                        ``2 * lease_s`` after the last write
==============================  ======  ================================================

``claim`` takes the lease when it is free (``SET NX PX``) or extends it when this
replica holds it (a compare-and-extend), and reads the published stage, in one round
trip (``scripts/pressure_claim.lua``); ``publish`` writes a stage only while this replica
still holds the lease (``scripts/pressure_publish.lua``), so a deposed poller cannot
overwrite its successor's; ``release`` hands the lease over at once when the holder stops.
A holder that dies stops renewing: another replica takes the lease within ``lease_s``.

Not on the request path: a redis-py connection of its own, one claim per replica per
poll interval plus the holder's publish, each call bounded by ``timeout_s``. Every
failure (unreachable, slower than ``timeout_s``, an error reply) raises
``StoreUnavailableError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

import orjson
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from sluicegate.store.keys import check_replica_id
from sluicegate.store.store_errors import StoreUnavailableError

__all__ = ["Claim", "PressureLease", "PublishedStage", "pressure_keys"]

_T = TypeVar("_T")
_ERRORS = (RedisError, OSError, EOFError, TimeoutError)
STAGE_KEEP_LEASES = 2
"""How many leases a published stage outlives its last write by."""


def pressure_keys(prefix: str) -> tuple[str, str]:
    """The lease and the published stage of the fleet ``prefix``."""
    return f"{{{prefix}}}:pressure:poller", f"{{{prefix}}}:pressure:stage"


@dataclass(frozen=True, slots=True)
class PublishedStage:
    """What the poller computed at its last poll: the stage, the retry hint of a closed
    lane's refusals, whether every query answered (the error if not) and each signal's
    value (``None``: no sample)."""

    stage: int
    retry_s: float
    up: bool
    error: str | None
    readings: Mapping[str, float | None]

    def encode(self) -> bytes:
        """The JSON stored in the stage hash."""
        return orjson.dumps(
            {
                "stage": self.stage,
                "retry_s": self.retry_s,
                "up": self.up,
                "error": self.error,
                "readings": dict(self.readings),
            }
        )

    @classmethod
    def decode(cls, raw: str) -> PublishedStage | None:
        """The stage back from its JSON; ``None`` if it is not one (written by another
        version, say): a replica then keeps the stage it has."""
        try:
            data = orjson.loads(raw)
            readings = {
                str(name): None if value is None else float(value)
                for name, value in data["readings"].items()
            }
            stage, retry_s = int(data["stage"]), float(data["retry_s"])
            error = data["error"]
            up = data["up"]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return None
        if stage < 0 or not math.isfinite(retry_s) or retry_s <= 0.0 or not isinstance(up, bool):
            return None
        return cls(stage, retry_s, up, None if error is None else str(error), readings)


@dataclass(frozen=True, slots=True)
class Claim:
    """The lease after a claim: who holds it, and the last published stage (``None``: none
    yet, or unreadable) with its age in seconds (by Redis's clock)."""

    holder: str
    published: PublishedStage | None
    age_s: float


class PressureLease:
    """One replica's side of the pressure poller's lease (see the module docstring)."""

    def __init__(
        self, url: str, *, prefix: str, replica: str, lease_s: float, timeout_s: float
    ) -> None:
        if not 0.0 < lease_s < math.inf or not 0.0 < timeout_s < math.inf:
            raise ValueError("lease_s and timeout_s must be positive and finite")
        self.replica = check_replica_id(replica)
        self.lease_s = lease_s
        self._url = url
        self._keys = pressure_keys(prefix)
        self._timeout_s = timeout_s
        self._client: Redis | None = None
        self._scripts: dict[str, AsyncScript] = {}

    def _connected(self) -> dict[str, AsyncScript]:
        if self._client is None:
            self._client = Redis.from_url(
                self._url,
                socket_timeout=self._timeout_s,
                socket_connect_timeout=self._timeout_s,
                retry=Retry(NoBackoff(), 0),
                decode_responses=True,
            )
            folder = resources.files("sluicegate.store").joinpath("scripts")
            self._scripts = {
                name: self._client.register_script(
                    folder.joinpath(f"pressure_{name}.lua").read_text(encoding="utf-8")
                )
                for name in ("claim", "publish", "release")
            }
        return self._scripts

    async def _bounded(self, call: Awaitable[_T]) -> _T:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await call
        except _ERRORS as error:
            raise StoreUnavailableError(f"redis store: {type(error).__name__}: {error}") from error

    def _ms(self, seconds: float) -> int:
        return max(1, round(seconds * 1000.0))

    async def claim(self) -> Claim:
        """Take or extend the lease if it is free or ours, and read the published stage."""
        script = self._connected()["claim"]
        reply: Any = await self._bounded(
            script(keys=list(self._keys), args=[self.replica, self._ms(self.lease_s)])
        )
        holder, raw, age_ms = reply
        published = None if raw is None else PublishedStage.decode(str(raw))
        return Claim(str(holder), published, max(0.0, int(age_ms) / 1000.0))

    async def publish(self, stage: PublishedStage) -> bool:
        """Write ``stage`` as the fleet's if this replica still holds the lease; whether it
        did."""
        script = self._connected()["publish"]
        keep_ms = self._ms(STAGE_KEEP_LEASES * self.lease_s)
        args: list[str | bytes | int] = [self.replica, stage.encode(), keep_ms]
        return bool(await self._bounded(script(keys=list(self._keys), args=args)))

    async def release(self) -> bool:
        """Give the lease up if this replica holds it (another takes it at its next
        claim); whether it did."""
        script = self._connected()["release"]
        return bool(await self._bounded(script(keys=[self._keys[0]], args=[self.replica])))

    async def close(self) -> None:
        """Release the lease if held and close the connection (never raises: a store that
        stopped answering cannot refuse a close)."""
        client = self._client
        if client is None:
            return
        with contextlib.suppress(StoreUnavailableError):
            await self.release()
        self._client = None
        self._scripts = {}
        with contextlib.suppress(*_ERRORS):
            await asyncio.wait_for(client.aclose(), self._timeout_s)
