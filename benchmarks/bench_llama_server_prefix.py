"""Two llama-server replicas behind the gateway: ``prefix_affinity`` vs ``least_inflight``
on requests that share long system prompts (issue 19).

The workload of ``tests/realengine/test_llama_server_prefix.py``: ``--groups`` distinct
system prompts of ~1,400 tokens, each used by ``--per-group`` streamed chats (a short
unique question, 8 tokens out), shuffled with a seed, sent by ``--concurrency`` clients in
a closed loop. Each router gets two fresh ``llama-server --parallel 4 --metrics`` replicas
(the tiny GGUF; ``--cache-ram 0`` by default, so a replica's prompt cache is its four
slots) and a gateway (``sluicegate serve``, one ``llama-server`` backend per replica,
``max_concurrency: 4`` each). Routers take turns, ``--repeats`` times, in alternating
order; the table gives medians over the repeats. Cached prompt tokens are the replicas'
``llamacpp:prompt_tokens_cached_total``; their share is of every prompt token (cached
plus ``llamacpp:prompt_tokens_total``, which excludes them). TTFT is measured by the
client, until the first ``data:`` line through the gateway.

    python benchmarks/bench_llama_server_prefix.py [--repeats 3] [--cache-ram 0,8192]
        [--write docs/BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np
import orjson
import pytest

from livestack import (
    CpuMeter,
    LiveStack,
    Process,
    fast_loop,
    live_stack,
    wide_console,
    write_report,
)
from tables import Grid, cells, ms, percentile_ms

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.gateway.gateway_harness import MODEL
from tests.realengine.llama_cpp_server import (
    LLAMA_SERVER_VERSION,
    LlamaCppServer,
    llama_server_binary,
)
from tests.realengine.test_llama_server_prefix import (
    CACHED,
    PROCESSED,
    ROUTERS,
    SLOTS,
    group_order,
    messages_for,
    replicas,
    routing_config,
)
from tests.realengine.tiny_gguf import write_tiny_gguf

OUTPUT_TOKENS = 8


@dataclass(frozen=True, slots=True)
class Sample:
    """One streamed request: seconds to the first ``data:`` line and to the end, and what
    went wrong (empty when it ended in ``data: [DONE]`` with no error event)."""

    ttft_s: float
    e2e_s: float
    problem: str

    @property
    def ok(self) -> bool:
        """Whether the stream completed without an error."""
        return not self.problem


@dataclass(frozen=True, slots=True)
class Run:
    """One router's run of the workload on fresh replicas."""

    router: str
    cache_ram: int
    concurrency: int
    samples: list[Sample]
    cached: float
    processed: float
    wall_s: float
    others_cores: float

    @property
    def share(self) -> float:
        """Cached prompt tokens as a fraction of every prompt token."""
        return self.cached / (self.cached + self.processed)

    def ttft_ms(self, q: float) -> float:
        """The ``q``-th percentile of the successful requests' TTFT, in ms."""
        return percentile_ms([s.ttft_s for s in self.samples if s.ok], q)

    @property
    def errors(self) -> int:
        """Requests that did not end in a complete stream."""
        return sum(not s.ok for s in self.samples)


async def streamed_chat(session: aiohttp.ClientSession, url: str, group: int, index: int) -> Sample:
    """One streamed chat through the gateway, timed from the send."""
    body = {
        "model": MODEL, "messages": messages_for(group, index), "max_tokens": OUTPUT_TOKENS,
        "temperature": 0.0, "stream": True,
    }  # fmt: skip
    start = time.perf_counter()
    ttft: float | None = None
    last = b""
    async with session.post(url, data=orjson.dumps(body)) as response:
        async for line in response.content:
            if line.startswith(b"data:"):
                ttft = time.perf_counter() - start if ttft is None else ttft
                last = line.strip()
                if b'"error"' in line:
                    break
        status = response.status
    problem = "" if status == 200 and last == b"data: [DONE]" else f"{status} {last[:200]!r}"
    return Sample(ttft or 0.0, time.perf_counter() - start, problem)


async def closed_loop(gateway_url: str, order: Sequence[int], concurrency: int) -> list[Sample]:
    """Send every request of ``order`` (group per request) with ``concurrency`` clients,
    each sending its next request as soon as its last one ends."""
    url = gateway_url + "/v1/chat/completions"
    pending = iter(enumerate(order))
    samples: list[Sample] = []
    headers = {"content-type": "application/json"}

    async def client(session: aiohttp.ClientSession) -> None:
        for index, group in pending:
            samples.append(await streamed_chat(session, url, group, index))

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return samples


def one_run(
    router: str,
    setting: tuple[int, int],
    model: Path,
    stack: LiveStack,
    args: argparse.Namespace,
) -> Run:
    """The workload through ``router`` on two fresh replicas and a fresh gateway, with
    ``setting`` = (replicas' ``--cache-ram`` MiB, concurrent clients)."""
    cache_ram, concurrency = setting
    order = group_order(args.groups, args.per_group, args.seed)
    log_dir = Path(tempfile.mkdtemp(prefix=f"{router}-", dir=stack.log_dir))
    extra = ("--threads", "1", "--cache-ram", str(cache_ram))
    with replicas(model, log_dir, extra) as servers:
        gateway = stack.gateway(routing_config(router, [s.url for s in servers]))
        meter = CpuMeter([gateway, *(_process(s) for s in servers)])
        start = time.monotonic()
        with asyncio.Runner(loop_factory=fast_loop) as runner:
            samples = runner.run(closed_loop(gateway.url, order, concurrency))
        wall = time.monotonic() - start
        others = meter.others_cores()
        totals = [s.metrics() for s in servers]
        stack.stop(gateway)
    return Run(
        router, cache_ram, concurrency, samples, cached=sum(m[CACHED] for m in totals),
        processed=sum(m[PROCESSED] for m in totals), wall_s=wall, others_cores=others,
    )  # fmt: skip


def _process(server: LlamaCppServer) -> Process:
    return Process("llama-server", server.url, server.pid)


def _median(values: Sequence[float]) -> float:
    return float(np.median(values))


def summary_grid(runs: Sequence[Run]) -> Grid:
    """Per setting (prompt cache, clients) and router: medians over the repeats."""
    rows = []
    for cache_ram, concurrency in dict.fromkeys((r.cache_ram, r.concurrency) for r in runs):
        for router in ROUTERS:
            mine = [
                r for r in runs
                if (r.router, r.cache_ram, r.concurrency) == (router, cache_ram, concurrency)
            ]  # fmt: skip
            cached = _median([r.cached for r in mine])
            prompt = _median([r.cached + r.processed for r in mine])
            rows.append(
                [
                    _cache_label(cache_ram), str(concurrency), f"`{router}`", str(len(mine)),
                    f"{prompt:,.0f}", f"{cached:,.0f}", f"{_median([r.share for r in mine]):.1%}",
                    ms(_median([r.ttft_ms(50) for r in mine])),
                    ms(_median([r.ttft_ms(99) for r in mine])),
                    str(sum(r.errors for r in mine)),
                ]
            )  # fmt: skip
    headers = "replica prompt cache|clients|router|runs|prompt tokens|cached prompt tokens|"
    headers += "cached share|TTFT p50 ms|TTFT p99 ms|errors"
    return "Cached prompt tokens and TTFT, medians over the runs", cells(headers), rows


def runs_grid(runs: Sequence[Run]) -> Grid:
    """Every run, in the order they ran."""
    rows = [
        [
            str(i + 1), _cache_label(r.cache_ram), str(r.concurrency), f"`{r.router}`",
            f"{r.cached:,.0f}", f"{r.share:.1%}", ms(r.ttft_ms(50)), ms(r.ttft_ms(99)),
            f"{r.wall_s:.1f}", f"{r.others_cores:.2f}",
        ]
        for i, r in enumerate(runs)
    ]  # fmt: skip
    headers = "run|replica prompt cache|clients|router|cached prompt tokens|cached share|"
    headers += "TTFT p50 ms|TTFT p99 ms|wall s|other processes' cores"
    return "Every run", cells(headers), rows


def _cache_label(cache_ram: int) -> str:
    return "4 slots" if cache_ram == 0 else f"4 slots + {cache_ram} MiB RAM"


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--groups", type=int, default=8, help="distinct system prompts")
    parser.add_argument("--per-group", type=int, default=10, help="requests per system prompt")
    parser.add_argument(
        "--concurrency", default="1,4", help="comma-separated numbers of closed-loop clients"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument(
        "--cache-ram", default="0,8192", help="comma-separated --cache-ram MiB values"
    )
    parser.add_argument("--section", default="bench_llama_server_prefix")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run both routers in turn, print the tables, optionally write them."""
    args = _arguments(argv)
    console = wide_console()
    try:
        llama_server_binary()  # fails, saying how to build it, when it is missing
    except pytest.fail.Exception as missing:
        console.print(str(missing))
        return 2
    runs: list[Run] = []
    with live_stack(console, "sluicegate-prefix-") as stack:
        model = write_tiny_gguf(stack.log_dir / "tiny.gguf")
        settings = [
            (int(cache_ram), int(concurrency))
            for cache_ram in args.cache_ram.split(",")
            for concurrency in args.concurrency.split(",")
        ]
        for setting in settings:
            for repeat in range(args.repeats):
                for router in ROUTERS[:: 1 if repeat % 2 == 0 else -1]:
                    label = f"{router}, --cache-ram {setting[0]}, {setting[1]} clients"
                    with console.status(f"{label}, run {repeat + 1}…"):
                        run = one_run(router, setting, model, stack, args)
                    runs.append(run)
                    for problem in dict.fromkeys(x.problem for x in run.samples if x.problem):
                        console.print(f"  [red]error[/red]: {problem}")
                    if run.errors:
                        stack.dump_logs(console)  # the gateways' logs
                    console.print(
                        f"  {label} #{repeat + 1}: cached {run.share:.1%}, TTFT p50 "
                        f"{run.ttft_ms(50):.1f} ms, p99 {run.ttft_ms(99):.1f} ms, "
                        f"{run.errors} errors, {run.wall_s:.1f} s"
                    )
    requests = args.groups * args.per_group
    notes = [
        f"Engine: `llama-server` built from llama-cpp-python {LLAMA_SERVER_VERSION}'s sdist, "
        f"two replicas, each `--parallel {SLOTS} -c 8192 --threads 1 --metrics` serving the "
        "tiny test GGUF (2,048 tokens a slot); gateway: `sluicegate serve`, one "
        f"`engine: llama-server` backend per replica with `max_concurrency: {SLOTS}`.",
        f"Workload: {args.groups} system prompts of ~1,500 tokens × {args.per_group} streamed "
        f"chats each ({requests} requests, seed {args.seed}, shuffled), {OUTPUT_TOKENS} tokens "
        f"out, closed loops of {args.concurrency.replace(',', ' and ')} clients. Each run "
        f"starts fresh replicas and a fresh gateway; {args.repeats} runs per router and "
        "setting, routers in alternating order. Cached prompt tokens: the replicas' "
        "`llamacpp:prompt_tokens_cached_total`; their share is of all prompt tokens.",
        "Replica prompt cache: `--cache-ram 0` leaves a replica only its 4 slots, each "
        "holding its last prompt (as an engine whose KV cache holds a few prompts); with "
        "`--cache-ram 8192` (llama-server's default) a slot's prompt is saved to host memory "
        "when the slot is reused and the best match is restored into whichever slot a "
        "request gets, so every replica ends up holding every prompt (the tiny model's KV is "
        "~0.5 KB a token) and `least_inflight` pays only one extra cold prefill per prompt "
        "and replica. With concurrent clients `prefix_affinity` gains less: a request leaves "
        "its prompt's home replica when that one has more than ⌈1.25·(in flight + 1)/2⌉ "
        "running (bounded loads), and within a replica a prompt held by a busy slot is not "
        "shared: a second request with the same prompt takes another slot and prefills it "
        "again, evicting another prompt.",
        "Client, gateway and both replicas share the machine. Processes not ours kept "
        f"{_median([r.others_cores for r in runs]):.2f} of {os.cpu_count()} cores busy "
        "(median over the runs), so TTFT (client-side, to the first `data:` line) is noisy.",
    ]
    write_report(
        args, script="bench_llama_server_prefix.py", section=args.section,
        title="llama-server replicas: `prefix_affinity` vs `least_inflight` (issue 19)",
        notes=notes, grids=[summary_grid(runs), runs_grid(runs)], argv=argv,
        out=console,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
