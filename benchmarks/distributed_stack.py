"""The processes of the distributed-mode benchmark: one private Redis, two emulated engines
and the gateways, grouped in fleets that share a key prefix (one fleet = one set of limits).

Every gateway serves the same two models: ``m`` (caps of 256 that never bind, on an
``instant`` engine: the gateway dominates) and ``h`` (cap 1, on an ``independent``
engine: a request takes exactly 10 ms per output token), and the same two tenants,
``free`` (no rate limits) and ``limited`` (rate limits far above any load, so every
request pays the store's ``take`` round trip but none is refused). A fleet of N
Redis-mode gateways uses its own ``key_prefix``: the fleets share the Redis server
but not a single key, so each is the N-replica deployment it stands for.

Also here: what the benchmark reads off these processes (CPU per process from /proc,
the gateways' store counters and store mode from their metrics, Redis's keys and
command statistics).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import aiohttp
from redis.asyncio import Redis

from distributed_load import Target
from livestack import LiveStack, Process, gauge, machine_busy_s
from sluicegate.demo.processes import free_port
from sluicegate.gateway.workers.private_redis import answers_ping
from tables import Grid, cells

__all__ = [
    "FAST_MODEL",
    "HANDOFF_MODEL",
    "KEYS",
    "Bench",
    "Fleet",
    "Meter",
    "fleet_config",
    "fleet_keys",
    "idle_cores",
    "link_state",
    "redis_commands",
    "running_redis",
    "start_fleet",
    "store_counters",
]

FAST_MODEL = "m"
HANDOFF_MODEL = "h"
KEYS = {"free": "sg-bench-free-key", "limited": "sg-bench-limited-key"}
"""Tenant → API key (the gateways read them from ``SG_BENCH_KEY_<TENANT>``)."""
ENV = {f"SG_BENCH_KEY_{tenant.upper()}": key for tenant, key in KEYS.items()}
LANE = (
    "{{name: interactive, max_concurrency: {cap}, max_queue: 8192, queue_timeout_s: 300, "
    "slo_ms: 600000, policy: fifo, preemptible: never}}"
)
CONFIG = """\
store: {store}
models:
  - name: {fast}
    backends: [{{name: e0, url: "{fast_url}", engine: emulator}}]
    max_concurrency: 256
    max_inflight_tokens: "off"
    lanes: [{fast_lane}]
  - name: {handoff}
    backends: [{{name: e0, url: "{handoff_url}", engine: emulator}}]
    max_concurrency: 1
    max_inflight_tokens: "off"
    lanes: [{handoff_lane}]
tenants:
  - {{name: free, api_key_env: SG_BENCH_KEY_FREE}}
  - {{name: limited, api_key_env: SG_BENCH_KEY_LIMITED, requests_per_s: 1000000,
      burst_requests: 1000000, tokens_per_min: 1000000000, burst_tokens: 1000000000}}
"""
DISTRIBUTED = (
    "distributed: {{replica_id: {replica}, key_prefix: {prefix}, lease_ttl_s: 5.0, "
    "timeout_ms: 50, on_store_failure: fail_open}}\n"
)
_REDIS_DEFAULT_PORT = 6379
ROUND_TRIPS = "sluicegate_store_round_trip_seconds_count"
FALLBACKS = "sluicegate_store_transitions_total"


def fleet_config(store: str, engines: dict[str, str], *, prefix: str, replica: str) -> str:
    """One gateway's YAML (without ``server:``): ``store`` is ``memory`` or a Redis URL."""
    text = CONFIG.format(
        store=store,
        fast=FAST_MODEL,
        fast_url=engines[FAST_MODEL],
        fast_lane=LANE.format(cap=256),
        handoff=HANDOFF_MODEL,
        handoff_url=engines[HANDOFF_MODEL],
        handoff_lane=LANE.format(cap=1),
    )
    if store != "memory":
        text += DISTRIBUTED.format(replica=replica, prefix=prefix)
    return text


@dataclass(frozen=True, slots=True)
class Fleet:
    """Gateways sharing one set of limits: a memory-mode gateway alone, or N Redis replicas."""

    name: str
    gateways: tuple[Process, ...]

    @property
    def urls(self) -> tuple[str, ...]:
        """The gateways' base URLs, in order."""
        return tuple(g.url for g in self.gateways)


def start_fleet(
    stack: LiveStack, name: str, store: str, engines: dict[str, str], size: int
) -> Fleet:
    """Start ``size`` gateways on ``store`` under the key prefix ``name``."""
    gateways = []
    for i in range(size):
        replica = f"{name}-{i + 1}"
        config = fleet_config(store, engines, prefix=name, replica=replica)
        started = stack.gateway(config, ENV)
        gateways.append(Process(replica, started.url, started.pid))
    return Fleet(name, tuple(gateways))


@contextlib.contextmanager
def running_redis() -> Iterator[Process]:
    """A private ``redis-server`` on a free loopback port (never 6379), without persistence;
    killed on exit. (The start logic of ``tests/store/redis_server.py``.)"""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = free_port()
    while port == _REDIS_DEFAULT_PORT:
        port = free_port()
    with tempfile.TemporaryDirectory(prefix="sluicegate-bench-redis-") as workdir:
        command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        command += ["--appendonly", "no", "--dir", workdir, "--loglevel", "warning"]
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10.0
            while not answers_ping(port):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {port}")
                time.sleep(0.01)
            yield Process("redis", f"redis://127.0.0.1:{port}/0", server.pid)
        finally:
            server.kill()
            server.wait()


@dataclass(frozen=True, slots=True)
class Bench:
    """The running processes: Redis, the engines and the fleets by name."""

    redis: Process
    engines: dict[str, Process]
    fleets: dict[str, Fleet]

    @property
    def processes(self) -> list[Process]:
        """Every process we started: Redis, the engines, every gateway."""
        gateways = [g for fleet in self.fleets.values() for g in fleet.gateways]
        return [self.redis, *self.engines.values(), *gateways]

    def target(self, name: str, fleet: str, tenant: str = "free") -> Target:
        """Requests for model ``m`` to every gateway of ``fleet``, as ``tenant``."""
        return Target(name, self.fleets[fleet].urls, KEYS[tenant], FAST_MODEL)

    def handoff_target(self, fleet: str, replica: int, max_tokens: int) -> Target:
        """Requests for the cap-1 model ``h`` to one replica of ``fleet``."""
        url = self.fleets[fleet].urls[replica]
        return Target(fleet, (url,), KEYS["free"], HANDOFF_MODEL, max_tokens)


async def store_counters(session: aiohttp.ClientSession, fleet: Fleet) -> tuple[float, float]:
    """(sync + take round trips, falls back from global mode) of the fleet's gateways so far."""
    trips = falls = 0.0
    for url in fleet.urls:
        for op in ("sync", "take"):
            trips += await gauge(session, url, ROUND_TRIPS, op=op)
        for mode in ("fail_open", "fail_closed"):
            falls += await gauge(session, url, FALLBACKS, mode=mode)
    return trips, falls


async def idle_cores(bench: Bench, seconds: float) -> dict[str, float]:
    """Cores each of our processes keeps busy with no load (heartbeats, scrapes, listeners)."""
    meter = Meter(bench.processes)
    await asyncio.sleep(seconds)
    used, wall = meter.read()
    return {name: cpu / wall for name, cpu in used.items()}


async def redis_commands(bench: Bench) -> Grid:
    """The commands Redis ran over the whole benchmark (``INFO commandstats``), costliest first."""
    redis = Redis.from_url(bench.redis.url)
    stats = await redis.info("commandstats")
    await redis.aclose()
    ranked = sorted(stats.items(), key=lambda item: -float(item[1]["usec"]))
    rows = []
    for name, stat in ranked[:8]:
        per_call, total_s = float(stat["usec_per_call"]), float(stat["usec"]) / 1e6
        rows.append([name.removeprefix("cmdstat_"), str(stat["calls"]), f"{per_call:.1f}"])
        rows[-1].append(f"{total_s:.2f}")
    headers = cells("command|calls|µs per call|CPU s in all")
    return "Redis commands over the whole run (INFO commandstats, costliest first)", headers, rows


async def fleet_keys(redis: Redis, prefix: str) -> int:
    """How many keys the fleet with key prefix ``prefix`` has in Redis."""
    return len([key async for key in redis.scan_iter(match=f"{{{prefix}:*", count=1000)])


async def link_state(bench: Bench, phase: str) -> list[str]:
    """After ``phase``: how many Redis-mode gateways are in global mode, which are not, and
    how often they fell back so far."""
    gateways = [g for name, f in bench.fleets.items() if name != "mem" for g in f.gateways]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10.0)) as session:
        modes = {g.name: await gauge(session, g.url, "sluicegate_store_global") for g in gateways}
        falls = [(await store_counters(session, f))[1] for f in bench.fleets.values()]
    stuck = ", ".join(name for name, mode in modes.items() if mode != 1.0) or "none"
    return [phase, f"{sum(modes.values()):.0f} of {len(modes)}", stuck, f"{sum(falls):.0f}"]


class Meter:
    """CPU seconds used, between construction and ``read``, by each watched process, by
    this process (``client``) and by the whole machine (``machine``)."""

    def __init__(self, processes: Sequence[Process]) -> None:
        self._processes = list(processes)
        self._wall = time.monotonic()
        self._start = self._now()

    def _now(self) -> dict[str, float]:
        used = {p.name: p.cpu_s() for p in self._processes}
        return used | {"client": time.process_time(), "machine": machine_busy_s()}

    def read(self) -> tuple[dict[str, float], float]:
        """(process name → CPU seconds since construction, wall seconds since construction)."""
        now = self._now()
        return {k: now[k] - self._start[k] for k in now}, time.monotonic() - self._wall
