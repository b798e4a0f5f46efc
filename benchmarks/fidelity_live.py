"""The fidelity benchmark's live side: llama-server replicas pinned to their cores, a gateway
in front, and the open-loop load generator replaying a trace slice through it.

Cores (the machine has two): this process, and so the gateway it starts and the load
generator it runs, stay on core 0; llama-server replica 0 gets core 1 to itself. A
second replica can only go on core 0, beside the gateway and the generator (there is no
third core): the two-replica cells measure that contention as much as the simulator
(running the gateway at nice 10 was tried: it starved the relay at saturation, 5.34
req/s for two replicas against 5.76 without).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import orjson
from tests.realengine.llama_cpp_server import LlamaCppServer, llama_cpp_server
from tests.realengine.tiny_gguf import Shape

from livestack import LiveStack
from sluicegate.bench.loadgen import run_load, synthetic_prompt
from sluicegate.bench.records import RequestRecord
from sluicegate.outcomes import WorkloadRequest

MODEL = "tiny"
SHAPE = Shape(width=256, layers=4, heads=4, ffn=768)
"""The model served: ~3.4 M parameters, so a decode step takes about a millisecond and a
1,000-token prefill ~0.2 s on one core; the tests' tiny model (64 wide, 2 layers) steps in
~50 µs, where HTTP would be nearly all of a request's time."""
SLOTS = 4
CTX = 8192
BATCH = 2048
"""llama-server's ``-b`` (logical batch) default: the most prompt tokens one step takes."""
SCRAPE_S = 1.0
ENGINE_CORES = (1, 0)
"""Replica i runs on core ``ENGINE_CORES[i]``; the gateway and the generator on core 0."""


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of process ``pid`` on ``cores`` (threads started later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cores)


def config_text(engine_urls: Sequence[str], policy: str) -> str:
    """The gateway's and the simulator's configuration: one lane over every slot.

    The lane's SLO (30 s) never sheds anything; under ``slack`` it orders the queue by
    deadline minus predicted work, which puts short requests first.
    """
    backends = "".join(
        f'      - {{name: llama-{i}, url: "{url}", engine: llama-server, '
        f"max_concurrency: {SLOTS}}}\n"
        for i, url in enumerate(engine_urls)
    )
    cap = SLOTS * len(engine_urls)
    return f"""\
models:
  - name: {MODEL}
    backends:
{backends}    max_concurrency: {cap}
    max_inflight_tokens: off
    lanes:
      - {{name: shared, max_concurrency: {cap}, max_queue: 100000, queue_timeout_s: 3600,
          slo_ms: 30000, policy: {policy}, preemptible: never}}
"""


@contextmanager
def engines(model: Path, replicas: int, log_dir: Path) -> Iterator[list[LlamaCppServer]]:
    """``replicas`` fresh llama-servers, each pinned to its core (a fresh one per run:
    llama-server keeps finished prompts in a RAM cache that would skip a rerun's prefill)."""
    with ExitStack() as stack:
        servers = []
        for i in range(replicas):
            server = stack.enter_context(
                llama_cpp_server(
                    model, parallel=SLOTS, ctx=CTX, log=log_dir / f"llama-server-{i}.log"
                )
            )
            pin(server.pid, {ENGINE_CORES[i]})
            servers.append(server)
        yield servers


def tokenized(engine_url: str, requests: Sequence[WorkloadRequest]) -> list[WorkloadRequest]:
    """``requests`` with ``prompt_tokens`` = what llama-server counts for the prompt the load
    generator sends request i (``synthetic_prompt(i, n)``)."""
    out = []
    for i, r in enumerate(requests):
        body = orjson.dumps({"content": synthetic_prompt(i, r.prompt_tokens), "add_special": True})
        request = urllib.request.Request(
            engine_url + "/tokenize", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            count = len(orjson.loads(response.read())["tokens"])
        out.append(dataclasses.replace(r, prompt_tokens=count))
    return out


def replay(
    stack: LiveStack,
    servers: Sequence[LlamaCppServer],
    policy: str,
    requests: list[WorkloadRequest],
) -> list[RequestRecord]:
    """``requests`` through a fresh gateway in front of ``servers``: the generator's records."""
    gateway = stack.gateway(
        config_text([s.url for s in servers], policy), server={"scrape_interval_s": SCRAPE_S}
    )
    try:
        result = asyncio.run(
            run_load(
                requests,
                base_url=gateway.url,
                model=MODEL,
                api_keys={},
                endpoint="completions",
                timeout_s=600.0,
            )
        )
    finally:
        stack.stop(gateway)
    return list(result.records)


def calibrate(url: str, out: Path, repeats: int) -> dict[str, Any]:
    """Run ``sluicegate calibrate`` against ``url`` (an engine, or a gateway in front of
    one, so the relay's cost lands in the fixed overheads as a client of the gateway pays
    it), writing the preset file ``out``; its contents, parsed."""
    command = [
        sys.executable, "-m", "sluicegate", "calibrate", "--url", url, "--model", MODEL,
        "--engine", "llama-server", "--out", str(out), "--repeats", str(repeats),
        "--slots", str(SLOTS), "--max-num-batched-tokens", str(BATCH),
        "--context", str(CTX // SLOTS),
    ]  # fmt: skip
    subprocess.run(command, check=True)
    data: dict[str, Any] = orjson.loads(out.read_bytes())
    return data
