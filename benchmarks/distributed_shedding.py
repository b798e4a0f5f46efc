"""Shedding agreement: three Redis-mode replicas against one in-memory gateway fed the same
arrivals (DESIGN §16, work summaries). Each replica's start estimate adds the other
replicas' work, so ``shed_hopeless`` should decide as one process does.

For each lane policy, a model ``s`` (cap 8, one ``shed_hopeless`` lane) on
``independent`` engines (10 ms per output token, whatever else runs): one gateway in
memory mode, a second one (the control: what two runs of one process differ by, timing
alone), and a fleet of three on one Redis (key prefix ``shed-<policy>``), each system
with an engine of its own. Every arrival of one seeded plan is sent at the same moment
to both single gateways and to one replica of the fleet, picked with a skew (60/25/15 %:
a sticky balancer), so each replica's own queue is a poor sample of the whole. Arrivals:
Poisson at ``rate`` (default 1.5× the lane's capacity of 16 requests/s), 20–80 output
tokens (0.2–0.8 s), deadlines of 2.5 s (70 %) or 10 s, tenants ``a`` and ``b`` (weight
2). Every 0.25 s a probe (deadline 1 ms: always refused at once, changing nothing) goes
to all of them too: its ``retry-after-ms`` is the start estimate of a new ticket at the back of
a ``fifo`` lane, at the front of a ``slack`` one.

Reported per policy, for the fleet and for the control, each against the single gateway:
how many each shed on arrival, the share of arrivals with the same decision on arrival
and with the same outcome (served, shed on arrival, shed at the latest start), and how
far the estimates (``retry-after-ms``) differ where both refused the same arrival, and
on the probes.

The lead's benchmark calls it with its stack and Redis::

    from distributed_shedding import shedding_agreement
    grids.append(await shedding_agreement(stack, redis, duration_s=20.0, console=console))

Alone: ``python benchmarks/distributed_shedding.py [--duration-s 30] [--policy fifo …]``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
import orjson
from rich.console import Console

from distributed_load import CHAT_PATH, client_session
from distributed_stack import running_redis
from livestack import LiveStack, Process, fast_loop, gauge, live_stack, wide_console
from tables import Grid, cells, pct, render

__all__ = ["Arrival", "arrival_plan", "replay", "shedding_agreement"]

MODEL = "s"
SLOTS = 8
MEAN_S = 0.5
"""Mean service: 50 output tokens at 10 ms each."""
TIGHT_MS, LOOSE_MS, TIGHT_SHARE = 2500.0, 10_000.0, 0.7
SKEW = (0.6, 0.25, 0.15)
"""The share of arrivals each replica of the fleet receives."""
PROBE_EVERY_S = 0.25
AT_ARRIVAL_S = 0.5
"""An ``overloaded`` answered sooner was shed on arrival; later, at its latest start
(at least 2.5 s − 0.8 s after arrival)."""
KEYS = {"a": "sg-shed-key-a", "b": "sg-shed-key-b"}
ENV = {f"SG_SHED_KEY_{tenant.upper()}": key for tenant, key in KEYS.items()}
CONFIG = """\
store: {store}
models:
  - name: {model}
    backends: [{{name: e0, url: "{url}", engine: emulator}}]
    max_concurrency: {slots}
    max_inflight_tokens: "off"
    prior_output_tokens: 1000
    prior_decode_tokens_per_s: 100.0
    prior_prefill_tokens_per_s: 1000000.0
    lanes:
      - {{name: chat, max_concurrency: {slots}, max_queue: 100000, queue_timeout_s: 300,
          slo_ms: 600000, policy: {policy}, preemptible: never, shed_hopeless: true}}
tenants:
  - {{name: a, default_lane: chat, api_key_env: SG_SHED_KEY_A}}
  - {{name: b, weight: 2.0, default_lane: chat, api_key_env: SG_SHED_KEY_B}}
"""
DISTRIBUTED = (
    "distributed: {{replica_id: {replica}, key_prefix: {prefix}, lease_ttl_s: 5.0, "
    "timeout_ms: 250, on_store_failure: fail_open}}\n"
)
FALLBACKS = "sluicegate_store_transitions_total"


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request of the plan, sent to the single gateway and to one replica.

    Attributes:
        at: seconds from the plan's start.
        tokens: its output tokens (``ignore_eos``: exactly these).
        deadline_ms: its ``X-Sluicegate-Deadline-Ms``.
        tenant: whose key it carries.
        replica: the fleet's replica it goes to.
        probe: a probe (deadline 1 ms), not load.
    """

    at: float
    tokens: int
    deadline_ms: float
    tenant: str
    replica: int
    probe: bool = False


def arrival_plan(rate: float, duration_s: float, seed: int) -> list[Arrival]:
    """Poisson arrivals at ``rate`` for ``duration_s``, and a probe every ``PROBE_EVERY_S``
    (replicas in turn), in time order."""
    rng = random.Random(seed)
    plan: list[Arrival] = []
    at = rng.expovariate(rate)
    while at < duration_s:
        deadline = TIGHT_MS if rng.random() < TIGHT_SHARE else LOOSE_MS
        replica = rng.choices(range(len(SKEW)), SKEW)[0]
        plan.append(Arrival(at, rng.randint(20, 80), deadline, rng.choice("ab"), replica))
        at += rng.expovariate(rate)
    probes = int(duration_s / PROBE_EVERY_S)
    plan += [
        Arrival((i + 0.5) * PROBE_EVERY_S, 50, 1.0, "a", i % len(SKEW), probe=True)
        for i in range(probes)
    ]
    return sorted(plan, key=lambda arrival: arrival.at)


@dataclass(frozen=True, slots=True)
class Seen:
    """One answer: status, error code (``""`` for a 200), ``retry-after-ms`` in seconds
    (NaN when absent) and seconds from sending to the answer."""

    status: int
    code: str
    retry_s: float
    answered_s: float

    @property
    def outcome(self) -> str:
        """``served``, ``shed`` (on arrival), ``late`` (at its latest start) or the error."""
        if self.status == 200:
            return "served"
        if self.code == "overloaded":
            return "shed" if self.answered_s < AT_ARRIVAL_S else "late"
        return self.code or f"HTTP {self.status}"


async def _post(session: aiohttp.ClientSession, url: str, arrival: Arrival) -> Seen:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": arrival.tokens,
        "ignore_eos": True,
    }
    headers = {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {KEYS[arrival.tenant]}",
        "X-Sluicegate-Deadline-Ms": f"{arrival.deadline_ms:g}",
    }
    started = time.perf_counter()
    try:
        async with session.post(url + CHAT_PATH, data=orjson.dumps(body), headers=headers) as r:
            data = await r.read()
            retry = r.headers.get("retry-after-ms")
            code = ""
            if r.status != 200:
                error = orjson.loads(data).get("error") or {}
                code = str(error.get("code") or "")
            retry_s = float(retry) / 1000 if retry is not None else math.nan
            return Seen(r.status, code, retry_s, time.perf_counter() - started)
    except (aiohttp.ClientError, OSError, TimeoutError, orjson.JSONDecodeError) as exc:
        return Seen(0, type(exc).__name__, math.nan, time.perf_counter() - started)


Answers = tuple[Arrival, Seen, Seen, Seen]
"""One arrival and its answers: from the single gateway, the control and the fleet."""


async def replay(
    single: str, control: str, fleet: Sequence[str], plan: Sequence[Arrival]
) -> list[Answers]:
    """Send each arrival at its time to ``single``, ``control`` and its replica of ``fleet``
    at once; the answers in plan order."""
    results: list[Answers | None] = [None] * len(plan)

    async def each(index: int, arrival: Arrival, session: aiohttp.ClientSession) -> None:
        urls = (single, control, fleet[arrival.replica])
        one, other, many = await asyncio.gather(*(_post(session, u, arrival) for u in urls))
        results[index] = (arrival, one, other, many)

    async with client_session(120.0) as session, asyncio.TaskGroup() as group:
        start = time.perf_counter()
        for index, arrival in enumerate(plan):
            delay = start + arrival.at - time.perf_counter()
            if delay > 0.0:
                await asyncio.sleep(delay)
            group.create_task(each(index, arrival, session))
    return [result for result in results if result is not None]


def _quantiles(values: Sequence[float]) -> str:
    """``p50 / p90`` of ``values`` in seconds, ``—`` when empty."""
    if not values:
        return "—"
    ordered = sorted(values)
    pick = [ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] for q in (0.5, 0.9)]
    return f"{pick[0]:.2f} / {pick[1]:.2f}"


def agreement_row(
    policy: str, compared: str, pairs: Sequence[tuple[Arrival, Seen, Seen]]
) -> list[str]:
    """One row: sheds, agreement on arrival and on the outcome, estimate gaps, between the
    single gateway's answers and ``compared``'s (the second of each pair)."""
    load = [(one, many) for arrival, one, many in pairs if not arrival.probe]
    probes = [(one, many) for arrival, one, many in pairs if arrival.probe]
    n = len(load)
    shed = Counter((one.outcome == "shed", many.outcome == "shed") for one, many in load)
    same_arrival = (shed[(True, True)] + shed[(False, False)]) / n if n else math.nan
    same_outcome = sum(one.outcome == many.outcome for one, many in load) / n if n else math.nan
    both = [abs(m.retry_s - o.retry_s) for o, m in load if o.outcome == m.outcome == "shed"]
    shed_probes = [(o, m) for o, m in probes if o.outcome == m.outcome == "shed"]
    gaps = [m.retry_s - o.retry_s for o, m in shed_probes]
    relative = [abs(m.retry_s - o.retry_s) / o.retry_s for o, m in shed_probes if o.retry_s >= 1]
    others = Counter(
        s.outcome for pair in load for s in pair if s.outcome not in ("served", "shed", "late")
    )
    row = [policy, compared, str(n), str(shed[(True, True)] + shed[(True, False)])]
    row += [str(shed[(True, True)] + shed[(False, True)]), pct(same_arrival), pct(same_outcome)]
    row += [f"{shed[(False, True)]} / {shed[(True, False)]}", _quantiles(both)]
    row += [_quantiles([abs(g) for g in gaps]), _quantiles(relative)]
    row += [f"{sum(gaps) / len(gaps):+.2f}" if gaps else "—"]
    return [*row, ", ".join(f"{k} {v}" for k, v in others.items()) or "none"]


HEADERS = cells(
    "policy|compared with one process|arrivals|shed on arrival: one process|by the other|"
    "same decision on arrival|same outcome|shed by the other only / one process only|"
    "both shed: estimate gap s p50 / p90|probes: gap s p50 / p90|"
    "probes ≥ 1 s: gap ÷ estimate p50 / p90|probes: mean gap s (other − one)|other outcomes"
)


async def _fallbacks(fleet: Sequence[Process]) -> float:
    async with client_session(10.0) as session:
        total = 0.0
        for gateway in fleet:
            for mode in ("fail_open", "fail_closed"):
                total += await gauge(session, gateway.url, FALLBACKS, mode=mode)
    return total


async def shedding_agreement(
    stack: LiveStack,
    redis: Process,
    *,
    policies: Sequence[str] = ("fifo", "slack"),
    rate: float = 1.5 * SLOTS / MEAN_S,
    duration_s: float = 30.0,
    seed: int = 3,
    console: Console | None = None,
) -> Grid:
    """Run the plan once per policy (its gateways started, then stopped); the table, two
    rows per policy: the fleet against the single process, and the control against it.

    ``stack`` starts the processes (three engines, and per policy two memory-mode gateways
    and three replicas on ``redis``). Takes about ``duration_s`` + 20 s per policy.
    """
    engines = [stack.engine(MODEL, "independent", max_num_seqs=512) for _ in range(3)]
    plan = arrival_plan(rate, duration_s, seed)
    rows = []
    for policy in policies:
        text = {"model": MODEL, "slots": SLOTS, "policy": policy}
        single, control = (
            stack.gateway(CONFIG.format(store="memory", url=engine.url, **text), ENV)
            for engine in engines[:2]
        )
        fleet = [
            stack.gateway(
                CONFIG.format(store=redis.url, url=engines[2].url, **text)
                + DISTRIBUTED.format(replica=f"shed-{i + 1}", prefix=f"shed-{policy}"),
                ENV,
            )
            for i in range(len(SKEW))
        ]
        await asyncio.sleep(1.0)  # every replica live in the store and exchanging
        if console is not None:
            console.print(f"shedding agreement, {policy}: {len(plan)} arrivals…")
        answers = await replay(single.url, control.url, [g.url for g in fleet], plan)
        row = agreement_row(policy, "3 replicas", [(a, one, many) for a, one, _, many in answers])
        row[-1] += f"; store fallbacks {await _fallbacks(fleet):.0f}"
        rows.append(row)
        rows.append(
            agreement_row(policy, "another process", [(a, one, o) for a, one, o, _ in answers])
        )
        for gateway in (single, control, *fleet):
            stack.stop(gateway)
    title = (
        f"Shedding: three replicas on Redis vs one process, the same arrivals "
        f"({rate:g}/s for {duration_s:g} s, {SLOTS} slots of {MEAN_S:g} s mean service)"
    )
    return title, HEADERS, rows


async def _main(args: argparse.Namespace, console: Console) -> Grid:
    with live_stack(console, "sluicegate-shed-") as stack, running_redis() as redis:
        return await shedding_agreement(
            stack,
            redis,
            policies=args.policy,
            rate=args.rate,
            duration_s=args.duration_s,
            seed=args.seed,
            console=console,
        )


def main(argv: list[str] | None = None) -> None:
    """Run the measurement alone and print its table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--policy", nargs="+", default=["fifo", "slack"])
    parser.add_argument("--rate", type=float, default=1.5 * SLOTS / MEAN_S)
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)
    console = wide_console()
    grid = fast_loop().run_until_complete(_main(args, console))
    render(console, grid)


if __name__ == "__main__":
    main()
