"""The pressure loop: poll Prometheus, tighten admission lane by lane (DESIGN §5).

Every ``interval_s`` the loop runs each configured query against Prometheus's HTTP
API (``/api/v1/query``), all within ``timeout_s``, and hands the readings to
``core.pressure.PressureController``; the stage it returns goes to the scheduler
through the driver. A poll in which any query fails (unreachable, timeout, an
error answer, a bad query) puts admission back as configured (stage 0): the gateway
does not guess. The first failure after a success, and the first success after a
failure, are logged once each.

With a shared store (distributed mode, ``serve --workers``) one replica of the fleet polls:
each interval every replica claims the store's lease (``store/pressure_lease.py``, held
for ``LEASE_INTERVALS`` intervals and renewed at every poll). The holder polls and
publishes the stage it computed; the others read it and apply it exactly as the poller
does, and take over the poller's stage (a new holder goes on from there, one step per
poll). A replica that cannot reach the store polls on its own until it can.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import Mapping
from typing import Literal, Protocol

import aiohttp
import orjson

from sluicegate.config import Config
from sluicegate.config_pressure import PressureSpec
from sluicegate.core.pressure import PressureController, PressureSignal, max_stage
from sluicegate.core.spec import ModelSpec
from sluicegate.errors import SluicegateError
from sluicegate.store.pressure_lease import Claim, PressureLease, PublishedStage
from sluicegate.store.store_errors import StoreUnavailableError

__all__ = ["LEASE_INTERVALS", "ApplyStage", "PressureLoop", "PressureQueryError", "fleet_lease"]

log = logging.getLogger("sluicegate.pressure")

LEASE_INTERVALS = 3
"""The poller's lease, in poll intervals: renewed at every poll (which takes at most two
intervals, its timeout included), so a live holder keeps it and a dead one's is taken
over within three."""

Role = Literal["starting", "local", "holder", "follower"]
"""Who polls, as this process sees it: ``local`` polls on its own (no shared store, or the
store is unavailable), ``holder`` polls for the fleet, ``follower`` reads the holder's stage."""


class ApplyStage(Protocol):
    """Where each interval's stage goes (``SchedulerDriver.set_pressure``)."""

    def __call__(self, stage: int, *, retry_s: float) -> None:
        """Move the scheduler to ``stage``; a closed lane's refusals advise ``retry_s``."""
        ...


def fleet_lease(config: Config, replica: str) -> PressureLease | None:
    """The poller's lease in ``config``'s shared store for ``replica`` (``None`` without a
    shared store or ``pressure:``)."""
    if config.pressure is None or not config.shared_store:
        return None
    settings = config.distributed
    return PressureLease(
        config.store,
        prefix=settings.key_prefix,
        replica=replica,
        lease_s=LEASE_INTERVALS * config.pressure.interval_s,
        timeout_s=settings.timeout_ms / 1000.0,
    )


class PressureQueryError(SluicegateError):
    """A query could not be answered: the message says which and why (no secrets)."""


class PressureLoop:
    """Polls the configured queries and moves the scheduler's pressure stage."""

    def __init__(
        self,
        spec: PressureSpec,
        models: tuple[ModelSpec, ...],
        environ: Mapping[str, str] | None = None,
        *,
        lease: PressureLease | None = None,
    ) -> None:
        self.spec = spec
        self.lease = lease
        self.role: Role = "starting" if lease is not None else "local"
        self.holder: str | None = None
        # Age of the stage applied (by Redis's clock) when this replica read it; 0 polled here.
        self.stage_age_s: float | None = None
        self.signals = tuple(
            PressureSignal(
                s.name, s.threshold, s.threshold if s.clear_below is None else s.clear_below
            )
            for s in spec.signals
        )
        self.controller = PressureController(self.signals, max_stage(models))
        # The last value of each signal (``None``: no sample, or the poll failed).
        self.readings: dict[str, float | None] = {signal.name: None for signal in self.signals}
        self.up = False
        self.polled = False
        self.error: str | None = None
        env = os.environ if environ is None else environ
        token = env.get(spec.bearer_token_env) if spec.bearer_token_env else None
        # The shared session does not decompress (the relay passes bodies through as sent).
        self._headers = {"Accept-Encoding": "identity"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    @property
    def stage(self) -> int:
        """The stage now (0: admission as configured)."""
        return self.controller.stage

    async def poll_once(self, session: aiohttp.ClientSession) -> int:
        """Run every query once and return the stage the readings move to."""
        try:
            async with asyncio.timeout(self.spec.poll_timeout_s):
                values = await asyncio.gather(
                    *(self._query(session, s.query) for s in self.spec.signals)
                )
        except (PressureQueryError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._failed(_describe(exc, self.spec.poll_timeout_s))
            return self.controller.observe(None)
        self.readings = {s.name: value for s, value in zip(self.signals, values, strict=True)}
        if not self.up and self.polled:
            log.warning("pressure: Prometheus answers again; the pressure loop resumes")
        self.up, self.polled, self.error = True, True, None
        before = self.controller.stage
        stage = self.controller.observe(
            {name: value for name, value in self.readings.items() if value is not None}
        )
        if stage != before:
            log.info("pressure: stage %d -> %d", before, stage)
        return stage

    def _failed(self, error: str) -> None:
        if self.up or not self.polled:
            log.warning("pressure: %s; admission is as configured until Prometheus answers", error)
        self.up, self.polled, self.error = False, True, error
        self.readings = dict.fromkeys(self.readings)

    async def _query(self, session: aiohttp.ClientSession, query: str) -> float | None:
        url = f"{self.spec.prometheus_url}/api/v1/query"
        async with session.get(url, params={"query": query}, headers=self._headers) as reply:
            body = await reply.read()
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise PressureQueryError(f"Prometheus answered HTTP {reply.status}, not JSON") from None
        if not isinstance(answer, dict):
            raise PressureQueryError(f"Prometheus answered HTTP {reply.status}, not an object")
        if reply.status != 200 or answer.get("status") != "success":
            detail = str(answer.get("error", ""))[:200]
            raise PressureQueryError(f"query {query!r} failed (HTTP {reply.status}): {detail}")
        data = answer.get("data")
        return _largest_sample(data if isinstance(data, dict) else {})

    async def step(self, session: aiohttp.ClientSession) -> tuple[int, float]:
        """One interval: poll (on its own, or for the fleet as the lease's holder) or read
        the holder's stage; the stage to apply and the retry hint of a closed lane."""
        interval = self.spec.interval_s
        lease = self.lease
        claim = None
        if lease is not None:
            try:
                claim = await lease.claim()
            except StoreUnavailableError as exc:
                self._become("local", None, str(exc))
            else:
                mine = claim.holder == lease.replica
                self._become("holder" if mine else "follower", claim.holder)
        if claim is not None and self.role == "follower":
            return self._adopt(claim)
        stage = await self.poll_once(session)
        self.stage_age_s = 0.0
        if lease is not None and self.role == "holder":
            published = PublishedStage(stage, interval, self.up, self.error, self.readings)
            with contextlib.suppress(StoreUnavailableError):
                # Unpublished, the followers keep the last stage; the next claim decides anew.
                await lease.publish(published)
        return stage, interval

    def _become(self, role: Role, holder: str | None, why: str = "") -> None:
        if (role, holder) == (self.role, self.holder):
            return
        if role == "local":
            log.warning("pressure: %s; this replica polls Prometheus on its own", why)
        elif role == "holder":
            log.info("pressure: this replica polls Prometheus for the fleet")
        else:
            log.info("pressure: %s polls Prometheus; this replica applies its stage", holder)
        self.role, self.holder = role, holder

    def _adopt(self, claim: Claim) -> tuple[int, float]:
        """Take the holder's stage and readings as this replica's own (so that, if it takes
        the lease over, it goes on from there)."""
        published = claim.published
        if published is None:  # the holder has published nothing yet
            return self.stage, self.spec.interval_s
        before = self.controller.stage
        self.controller.stage = min(published.stage, self.controller.max_stage)
        if self.controller.stage != before:
            log.info("pressure: stage %d -> %d (from %s)", before, self.stage, claim.holder)
        self.readings = {name: published.readings.get(name) for name in self.readings}
        self.up, self.polled, self.error = published.up, True, published.error
        self.stage_age_s = claim.age_s
        return self.stage, published.retry_s

    async def run(self, session: aiohttp.ClientSession, apply: ApplyStage) -> None:
        """Run a step every ``interval_s`` until cancelled, handing each stage to ``apply``;
        then give the lease up, if held, so another replica polls at once."""
        try:
            while True:
                stage, retry_s = await self.step(session)
                apply(stage, retry_s=retry_s)
                await asyncio.sleep(self.spec.interval_s)
        finally:
            if self.lease is not None:
                await self.lease.close()

    @property
    def polls(self) -> bool:
        """Whether this process ran the queries at its last step (the holder, or one
        polling on its own)."""
        return self.role in ("local", "holder") and self.polled

    def status(self) -> dict[str, object]:
        """What ``/admin/state`` shows of the loop."""
        status = "ok" if self.up else "prometheus_unavailable" if self.polled else "starting"
        return {
            "stage": self.stage,
            "max_stage": self.controller.max_stage,
            "up": self.up,
            "status": status,
            "error": self.error,
            "interval_s": self.spec.interval_s,
            "poller": {"role": self.role, "holder": self.holder, "stage_age_s": self.stage_age_s},
            "signals": [
                {
                    "name": signal.name,
                    "query": spec.query,
                    "value": self.readings[signal.name],
                    "threshold": signal.threshold,
                    "clear_below": signal.clear_below,
                    "above": self.up
                    and self.controller.above(signal, self.readings[signal.name] or 0.0),
                }
                for signal, spec in zip(self.signals, self.spec.signals, strict=True)
            ],
        }


def _largest_sample(data: Mapping[str, object]) -> float | None:
    """The largest finite value of a query answer (vector or scalar); ``None`` if none."""
    kind, result = data.get("resultType"), data.get("result")
    raw: list[object] = []
    if kind == "scalar" and isinstance(result, list) and len(result) == 2:
        raw = [result[1]]
    elif kind == "vector" and isinstance(result, list):
        raw = [_sample_value(sample) for sample in result]
    else:
        raise PressureQueryError(f"the query must give an instant vector or a scalar, not {kind}")
    values = []
    for text in raw:
        try:
            value = float(str(text))
        except ValueError:
            continue
        if math.isfinite(value):
            values.append(value)
    return max(values, default=None)


def _sample_value(sample: object) -> object:
    """The value of one vector sample, ``None`` when it is not shaped as one."""
    if isinstance(sample, dict):
        pair = sample.get("value")
        if isinstance(pair, list) and len(pair) == 2:
            return pair[1]
    return None


def _describe(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"Prometheus did not answer within {timeout_s:g} s"
    if isinstance(exc, PressureQueryError):
        return str(exc)
    return f"Prometheus is unreachable ({type(exc).__name__})"
