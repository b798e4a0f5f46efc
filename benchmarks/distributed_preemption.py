"""The preemption phase of the distributed benchmark: an urgent request at one replica
stops a background one running through another, against one process doing the same.

Model ``p`` (cap 4, engine preset ``independent``: 10 ms per output token), lanes
``interactive`` (``preempt_after_ms`` 200, never preemptible) and ``best_effort``
(``preemptible: always``, abort); tenant ``bg`` (priority 5) and ``fg`` (priority 0).
A round: four long ``bg`` requests (4 s) fill the engine through the first gateway;
100 ms after the engine runs them, four short ``fg`` requests (50 ms) arrive through
the second. Each waits 200 ms, turns urgent and has a long one stopped for it. The
memory-mode gateway (``pmem``, both tenants through it) and a fleet of three Redis
replicas (``pre``) take turns, round by round; the engine's ``max_running_seen`` is
read after each round (a cap excursion is a round where it exceeded 4).
"""

from __future__ import annotations

import asyncio
import statistics
import time

import aiohttp
import orjson

from distributed_stack import Fleet, store_counters
from livestack import LiveStack, Process
from tables import Grid, cells

MODEL = "p"
CAP = 4
LONG_TOKENS = 400
SHORT_TOKENS = 5
KEYS = {"fg": "sg-bench-fg-key", "bg": "sg-bench-bg-key"}
ENV = {f"SG_BENCH_KEY_{tenant.upper()}": key for tenant, key in KEYS.items()}
CONFIG = """\
store: {store}
models:
  - name: p
    backends: [{{name: e0, url: "{url}", engine: emulator}}]
    max_concurrency: 4
    max_inflight_tokens: "off"
    lanes:
      - {{name: interactive, max_concurrency: 4, max_queue: 64, queue_timeout_s: 60,
          slo_ms: 600000, policy: fifo, preemptible: never, preempt_after_ms: 200}}
      - {{name: best_effort, max_concurrency: 4, max_queue: 64, queue_timeout_s: 60,
          slo_ms: 600000, policy: fifo, preemptible: always, preempt_action: abort}}
tenants:
  - {{name: fg, api_key_env: SG_BENCH_KEY_FG, default_lane: interactive, default_priority: 0}}
  - {{name: bg, api_key_env: SG_BENCH_KEY_BG, default_lane: best_effort, default_priority: 5}}
"""
DISTRIBUTED = (
    "distributed: {{replica_id: {replica}, key_prefix: pre, lease_ttl_s: 5.0, "
    "timeout_ms: 50, on_store_failure: fail_open}}\n"
)


def start_preemption(stack: LiveStack, redis: Process) -> tuple[Process, Fleet, Fleet]:
    """The engine, the memory-mode gateway and the three Redis replicas of this phase."""
    engine = stack.engine(MODEL, "independent", max_num_seqs=64)
    single = stack.gateway(CONFIG.format(store="memory", url=engine.url), ENV)
    replicas = []
    for i in range(3):
        text = CONFIG.format(store=redis.url, url=engine.url)
        text += DISTRIBUTED.format(replica=f"pre-{i + 1}")
        started = stack.gateway(text, ENV)
        replicas.append(Process(f"pre-{i + 1}", started.url, started.pid))
    mem = Fleet("pmem", (Process("pmem", single.url, single.pid),))
    return engine, mem, Fleet("pre", tuple(replicas))


async def _send(
    session: aiohttp.ClientSession, url: str, tenant: str, max_tokens: int
) -> tuple[int, float]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about admission control."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    headers = {"Authorization": f"Bearer {KEYS[tenant]}", "Content-Type": "application/json"}
    started = time.monotonic()
    async with session.post(f"{url}/v1/chat/completions", data=orjson.dumps(body),
                            headers=headers) as response:  # fmt: skip
        await response.read()
        return response.status, time.monotonic() - started


async def _engine(session: aiohttp.ClientSession, engine: Process) -> dict[str, float]:
    async with session.get(f"{engine.url}/emulator/stats") as response:
        stats: dict[str, float] = orjson.loads(await response.read())
    return stats


async def _round(
    session: aiohttp.ClientSession, engine: Process, fleet: Fleet
) -> tuple[list[float], int, float]:
    """One round through ``fleet`` (long ones at its first gateway, short ones at its
    last): the short ones' latencies, how many long ones were cut short, and the most
    the engine ran at once so far."""
    first, last = fleet.urls[0], fleet.urls[-1]
    longs = [asyncio.create_task(_send(session, first, "bg", LONG_TOKENS)) for _ in range(CAP)]
    while (await _engine(session, engine))["running"] < CAP:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    shorts = await asyncio.gather(*(_send(session, last, "fg", SHORT_TOKENS) for _ in range(CAP)))
    ended = await asyncio.gather(*longs)
    cut = sum(1 for status, seconds in ended if status == 200 and seconds < LONG_TOKENS * 0.005)
    latencies = [seconds for status, seconds in shorts if status == 200]
    return latencies, cut, float((await _engine(session, engine))["max_running_seen"])


async def preemption(
    engine: Process, fleets: tuple[Fleet, Fleet], rounds: int
) -> tuple[Grid, dict[str, float]]:
    """``rounds`` rounds on each fleet, taking turns; the grid and each fleet's median."""
    timeout = aiohttp.ClientTimeout(total=60.0)
    samples: dict[str, list[float]] = {fleet.name: [] for fleet in fleets}
    cut: dict[str, int] = dict.fromkeys(samples, 0)
    excursions: dict[str, int] = dict.fromkeys(samples, 0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        falls_before = {f.name: (await store_counters(session, f))[1] for f in fleets}
        for _ in range(rounds):
            for fleet in fleets:
                latencies, stopped, most = await _round(session, engine, fleet)
                samples[fleet.name] += latencies
                cut[fleet.name] += stopped
                excursions[fleet.name] += int(most > CAP)
        falls = {f.name: (await store_counters(session, f))[1] - falls_before[f.name]
                 for f in fleets}  # fmt: skip
    medians = {name: statistics.median(values) for name, values in samples.items()}
    reference = medians[fleets[0].name]
    rows = []
    for fleet in fleets:
        values = sorted(samples[fleet.name])
        row = [fleet.name, str(len(fleet.gateways)), str(len(values))]
        row += [f"{medians[fleet.name] * 1000:.0f}", f"{values[-1] * 1000:.0f}"]
        row += [f"{medians[fleet.name] / reference:.2f}×", f"{cut[fleet.name]} of {rounds * CAP}"]
        row += [str(excursions[fleet.name]), f"{falls[fleet.name]:.0f}"]
        rows.append(row)
    headers = "fleet|gateways|interactive requests|e2e p50 ms|e2e max ms|p50 ÷ one process|"
    headers += "long requests stopped|rounds over the cap|store fallbacks"
    title = (
        "Preemption across replicas: 4 urgent interactive requests at one gateway, "
        "4 long best-effort ones running through another (cap 4, preempt_after_ms 200)"
    )
    return (title, cells(headers), rows), medians
