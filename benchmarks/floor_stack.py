"""Processes and load for ``bench_floor.py``: the targets in front of one upstream, the
lean paced generator that drives them all at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import shlex
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp

import fake_upstream
from overhead_stack import MODEL, PROMPT_TOKENS
from sluicegate.bench.loadgen import build_headers
from sluicegate.demo.processes import children, free_port
from sluicegate.outcomes import WorkloadRequest

DIRECT, FLOOR, ENGINE = "direct", "pass-through", "engine"
KEY_ENV, KEY = "SLUICEGATE_FLOOR_BENCH_KEY", "floor-bench-key"
GATEWAY_CONFIG = """\
server: {{host: 127.0.0.1, port: {port}, admin_key_env: null, scrape_interval_s: 1.0}}
models:
  - name: {model}
    backends: [{{name: e0, url: "http://127.0.0.1:{engine}", engine: {kind}}}]
    max_concurrency: 100000
    lanes:
      - {{name: interactive, max_concurrency: 100000, max_queue: 100000, queue_timeout_s: 30,
          slo_ms: 20000, policy: slack{lane_extra}}}
tenants:
  - {{name: bench, api_key_env: {key_env}, default_lane: interactive}}
"""

LANE_SETUPS = {
    "never": ", preemptible: never",
    "default": "",
    "requeue": ", preempt_action: requeue",
    "always": ", preemptible: always",
}
"""``--config`` names → what the lane adds to its fields: ``never`` cannot preempt;
``default`` leaves ``preemptible`` unset (priority tiers: the bench's priority-2
requests are preemptible after 80% of their output, so every one may be), and
``requeue`` is that with ``preempt_action: requeue``; ``always`` may stop any ticket at
once, so every non-streamed request is streamed upstream and reassembled."""


def gateway_config(setup: str, *, port: int, engine: int, kind: str) -> str:
    """The YAML of a sluicegate in front of the upstream on ``engine``, lane set up as
    ``LANE_SETUPS[setup]``."""
    return GATEWAY_CONFIG.format(
        port=port, model=MODEL, engine=engine, kind=kind, key_env=KEY_ENV,
        lane_extra=LANE_SETUPS[setup],
    )  # fmt: skip


Sample = tuple[int, float, float, float, str]
"""(slot, launch lag s, latency s, time to first data s or NaN, error or "") of one request."""


@dataclass(frozen=True, slots=True)
class Stack:
    """The running targets in front of one upstream: base URLs, and pids by role."""

    upstream: str
    urls: dict[str, str]
    pids: dict[str, int]

    @property
    def gateways(self) -> list[str]:
        """The sluicegate targets (the main one, then the variants)."""
        return [name for name in self.urls if name not in (DIRECT, FLOOR)]


def gateway_args(args: argparse.Namespace) -> dict[str, tuple[str, list[str]]]:
    """Name → (lane set-up, extra ``serve`` arguments) of every sluicegate target: the
    main one per ``--config`` (named ``LABEL (SETUP)`` when there are several), then
    each ``--variant`` with the first set-up."""
    extra = [a for arg in args.gateway_arg for a in shlex.split(arg)]
    setups: list[str] = args.config or ["never"]
    wanted = {
        (args.label if len(setups) == 1 else f"{args.label} ({setup})"): (setup, extra)
        for setup in setups
    }
    for spec in args.variant:
        name, _, more = spec.partition("=")
        if not name or name in (*wanted, DIRECT, FLOOR, ENGINE):
            raise SystemExit(f"--variant {spec!r}: give a new NAME=ARGS")
        wanted[name] = (setups[0], shlex.split(more))
    return wanted


@contextlib.contextmanager
def stack(upstream: str, args: argparse.Namespace, log_dir: Path) -> Iterator[Stack]:
    """Start the upstream, the pass-through and every sluicegate; stop them all on exit."""
    os.environ[KEY_ENV] = KEY  # the gateways inherit it
    with children(log_dir) as group:
        engine = free_port()
        base = f"http://127.0.0.1:{engine}"
        if upstream == "fake":
            engine_pid = group.run(ENGINE, fake_upstream.command(engine, MODEL), base + "/health")
        else:
            argv = ["emulate", "--port", str(engine), "--preset", args.preset, "--model", MODEL]
            engine_pid = group.start(ENGINE, argv, base + "/health")
        urls, pids = {DIRECT: base}, {ENGINE: engine_pid}
        port = free_port()
        argv = ["passthrough", "--port", str(port), "--backend", base]
        urls[FLOOR] = f"http://127.0.0.1:{port}"
        pids[FLOOR] = group.start(FLOOR, argv, urls[FLOOR] + "/health")
        kind = "vllm" if upstream == "fake" else "emulator"
        for i, (name, (setup, extra)) in enumerate(gateway_args(args).items()):
            port, config = free_port(), log_dir / f"gateway-{upstream}-{i}.yaml"
            config.write_text(gateway_config(setup, port=port, engine=engine, kind=kind))
            url = f"http://127.0.0.1:{port}"
            # Every sluicegate runs from ``--site`` when given (e.g. the installed wheel).
            env = {"PYTHONPATH": args.site} if args.site else None
            argv = ["serve", "--config", str(config), *extra]
            urls[name] = url
            pids[name] = group.start(f"gateway-{i}", argv, url + "/readyz", env=env)
        yield Stack(upstream, urls, pids)


async def paced(
    urls: Mapping[str, str], n: int, rate: float, body: bytes, *, stream: bool, timeout_s: float
) -> dict[str, list[Sample]]:
    """Send ``n`` copies of ``body`` to every URL; slot i of target k starts at
    ``(i + ((k + i) mod K) / K) / rate``. Never waits for a response to launch."""
    clock = time.perf_counter  # uvloop's loop.time() ticks in whole milliseconds
    request = WorkloadRequest(0.0, PROMPT_TOKENS, 2, 2)
    headers = build_headers(request, api_keys={"default": KEY}, send_lane_headers=True)
    names = list(urls)
    samples: dict[str, list[Sample]] = {name: [] for name in names}

    async def one(name: str, session: aiohttp.ClientSession, i: int, at: float) -> None:
        launched, first, error = clock(), math.nan, ""
        try:
            async with session.post(urls[name], data=body, headers=headers) as response:
                if stream:
                    async for chunk in response.content.iter_any():
                        if math.isnan(first) and b"data:" in chunk:
                            first = clock() - launched
                else:
                    await response.read()
                error = "" if response.status == 200 else f"HTTP {response.status}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            error = type(exc).__name__
        samples[name].append((i, launched - start - at, clock() - launched, first, error))

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with contextlib.AsyncExitStack() as sessions_open:
        sessions = {
            name: await sessions_open.enter_async_context(
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout)
            )
            for name in names
        }
        start = clock()
        async with asyncio.TaskGroup() as group:
            for i in range(n):
                for k in range(len(names)):
                    name = names[(i + k) % len(names)]
                    at = (i + k / len(names)) / rate
                    delay = start + at - clock()
                    if delay > 0.0:
                        await asyncio.sleep(delay)
                    group.create_task(one(name, sessions[name], i, at))
    return samples
