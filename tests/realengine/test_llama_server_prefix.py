"""Two llama-server replicas behind the gateway: ``prefix_affinity`` keeps each long system
prompt on one replica, so the replica's slots reuse it; ``least_inflight`` spreads each
prompt over both, so they reuse less (issue 19).

Groups of requests share a long system prompt (one prompt of random words per group, so
two differ within their first few characters and each hashes to its own ``prefix_key``);
the groups are interleaved in a seeded random order. Each replica runs ``--parallel 4
--threads 1 --cache-ram 0``, so its prompt cache is its four slots, as on an engine whose
KV cache holds a few prompts. llama-server's default host-memory prompt cache
(``--cache-ram 8192`` MiB) keeps every prompt of the tiny model (~0.5 KB of KV a token),
which narrows the difference (the last test). The workload and the stack are shared with
``benchmarks/bench_llama_server_prefix.py``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from sluicegate.config import parse_config
from sluicegate.gateway.app import build_app
from tests.gateway.gateway_harness import ADMIN_KEY, MODEL, serve_in_thread
from tests.realengine.llama_cpp_server import LlamaCppServer, llama_cpp_server

pytestmark = pytest.mark.realengine

SLOTS = 4  # --parallel per replica, and the gateway's cap per backend
CONTEXT = 8192  # -c: split over the slots, 2048 a slot (the tiny model's training context)
SYSTEM_CHARS = 1500  # ~1,480 tokens of the byte-level vocabulary: most of a slot's context
# One thread per replica: two replicas share the 2 cores, and llama.cpp's default (every
# core) makes its threads spin against each other (a decode step took ~300 ms instead of ~1).
ENGINE_ARGS = ("--threads", "1", "--cache-ram", "0")
REPLICAS = ("replica-a", "replica-b")
ROUTERS = ("prefix_affinity", "least_inflight")
# The chat template's and the user turn's tokens: what a request adds to its system prompt.
TURN_TOKENS = 64
# 8 groups: a replica's share under prefix_affinity is about its 4 slots, all 8 twice as many.
GROUPS, PER_GROUP, SEED = 8, 5, 19


def system_prompt(group: int) -> str:
    """A long system prompt of random words, seeded by ``group``."""
    rng = random.Random(f"system-{group}")
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < SYSTEM_CHARS:
        words.append("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))))
    return " ".join(words)[:SYSTEM_CHARS]


def group_order(groups: int, per_group: int, seed: int) -> list[int]:
    """Each group ``per_group`` times, shuffled: consecutive requests rarely share a group,
    and (unlike a round robin over the groups) alternating replicas does not keep a group
    on one replica by accident."""
    order = [g for g in range(groups) for _ in range(per_group)]
    random.Random(seed).shuffle(order)
    return order


def messages_for(group: int, index: int) -> list[ChatCompletionMessageParam]:
    """Group ``group``'s system prompt and a short question unique to request ``index``."""
    return [
        {"role": "system", "content": system_prompt(group)},
        {"role": "user", "content": f"Question {index}: answer briefly."},
    ]


def routing_config(router: str, urls: Sequence[str]) -> str:
    """Gateway YAML: model ``tiny`` on one ``llama-server`` backend per URL, each capped at
    its slot count (so nothing waits in an engine's own queue), routed by ``router``."""
    backends = "".join(
        f"      - {{name: {name}, url: '{url}', engine: llama-server, max_concurrency: {SLOTS}}}\n"
        for name, url in zip(REPLICAS, urls, strict=True)
    )
    return (
        f"models:\n  - name: {MODEL}\n    router: {router}\n"
        f"    max_concurrency: {SLOTS * len(urls)}\n    backends:\n{backends}"
    )


@contextmanager
def replicas(
    model: Path, log_dir: Path, extra: Sequence[str] = ENGINE_ARGS
) -> Iterator[list[LlamaCppServer]]:
    """Two fresh llama-server replicas (empty caches, counters at zero), stopped on exit."""
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                llama_cpp_server(
                    model, parallel=SLOTS, ctx=CONTEXT, log=log_dir / f"{name}.log", extra=extra
                )
            )
            for name in REPLICAS
        ]


CACHED = "llamacpp:prompt_tokens_cached_total"
PROCESSED = "llamacpp:prompt_tokens_total"  # prompt tokens evaluated, cached ones excluded


@dataclass(frozen=True)
class Served:
    """One request: its group, the replica whose counters it moved, and the prompt tokens
    that replica reused from its cache for it."""

    group: int
    replica: str
    prompt_tokens: int
    cached_tokens: float


@dataclass(frozen=True)
class RouterRun:
    """A router's run of the workload: each request, and the replicas' counter totals."""

    served: list[Served]
    cached_total: float
    processed_total: float

    def replicas_of(self, group: int) -> set[str]:
        """The replicas that served ``group``'s requests."""
        return {s.replica for s in self.served if s.group == group}


def prompt_counters(server: LlamaCppServer) -> tuple[float, float]:
    """The replica's (cached, processed) prompt-token counters."""
    metrics = server.metrics()
    return metrics[CACHED], metrics[PROCESSED]


def run_sequentially(router: str, servers: Sequence[LlamaCppServer], order: list[int]) -> RouterRun:
    """Send the workload one request at a time through a gateway routing with ``router``,
    each a non-streamed chat of 4 tokens with the official SDK. A request's replica is the
    one whose prompt-token counters (cached + processed) it moved, by exactly its
    ``usage.prompt_tokens``. (The gateway sends a non-streamed request to llama-server as a
    stream and keeps only the counts of its usage, so ``prompt_tokens_details`` is not
    passed on.)"""
    config = parse_config(routing_config(router, [s.url for s in servers]))
    app = build_app(config, environ={"SLUICEGATE_ADMIN_KEY": ADMIN_KEY})
    served = []
    initial = before = [prompt_counters(s) for s in servers]
    with (
        serve_in_thread(app) as port,
        openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0
        ) as client,
    ):
        for index, group in enumerate(order):
            answer = client.chat.completions.create(
                model=MODEL, messages=messages_for(group, index), max_tokens=4, temperature=0.0
            )
            after = [prompt_counters(s) for s in servers]
            moved = [i for i in range(len(servers)) if after[i] != before[i]]
            assert len(moved) == 1, (index, before, after)
            (i,) = moved
            cached, processed = (now - then for now, then in zip(after[i], before[i], strict=True))
            assert answer.usage is not None
            assert cached + processed == answer.usage.prompt_tokens, (index, answer.usage)
            served.append(Served(group, REPLICAS[i], answer.usage.prompt_tokens, cached))
            before = after
    return RouterRun(
        served,
        cached_total=sum(now[0] - then[0] for now, then in zip(before, initial, strict=True)),
        processed_total=sum(now[1] - then[1] for now, then in zip(before, initial, strict=True)),
    )


def both_routers(
    model: Path, tmp_path_factory: pytest.TempPathFactory, extra: Sequence[str]
) -> dict[str, RouterRun]:
    """The same workload through each router, each on two fresh replicas run with ``extra``."""
    order = group_order(GROUPS, PER_GROUP, SEED)
    done = {}
    for router in ROUTERS:
        with replicas(model, tmp_path_factory.mktemp(router), extra) as servers:
            done[router] = run_sequentially(router, servers, order)
    return done


@pytest.fixture(scope="module")
def runs(
    llama_server_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, RouterRun]:
    """Both routers, replicas whose prompt cache is their slots (``--cache-ram 0``)."""
    return both_routers(llama_server_model, tmp_path_factory, ENGINE_ARGS)


@pytest.fixture(scope="module")
def host_cache_runs(
    llama_server_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, RouterRun]:
    """Both routers, replicas with llama-server's default host-memory prompt cache."""
    return both_routers(llama_server_model, tmp_path_factory, ("--threads", "1"))


def test_prefix_affinity_keeps_each_system_prompt_on_one_replica(
    runs: dict[str, RouterRun],
) -> None:
    """With ``prefix_affinity`` every group's requests land on one replica, and the groups
    use both replicas; with ``least_inflight`` some group is served by both."""
    affine, spread = runs["prefix_affinity"], runs["least_inflight"]
    homes = {group: affine.replicas_of(group) for group in range(GROUPS)}
    assert all(len(home) == 1 for home in homes.values()), homes
    assert set().union(*homes.values()) == set(REPLICAS), homes
    assert any(len(spread.replicas_of(group)) == 2 for group in range(GROUPS))


def test_prefix_affinity_reuses_more_cached_prompt_tokens(runs: dict[str, RouterRun]) -> None:
    """``llamacpp:prompt_tokens_cached_total``, summed over the replicas, is higher with
    ``prefix_affinity`` than with ``least_inflight`` on the same workload, and the engines
    processed correspondingly fewer prompt tokens (each request's share of the counters is
    checked against its ``usage`` as it is answered)."""
    affine, spread = runs["prefix_affinity"], runs["least_inflight"]
    assert len(affine.served) == len(spread.served) == GROUPS * PER_GROUP
    assert affine.cached_total > spread.cached_total
    assert affine.processed_total < spread.processed_total
    assert affine.cached_total + affine.processed_total == (
        spread.cached_total + spread.processed_total
    )


def test_a_replica_with_a_slot_per_group_reuses_every_system_prompt(
    runs: dict[str, RouterRun],
) -> None:
    """With ``prefix_affinity``, on a replica that serves no more groups than it has slots,
    a group's first request reuses at most the chat template's opening tokens and every
    later one reuses its whole system prompt (all but the last turn's tokens)."""
    affine = runs["prefix_affinity"]
    roomy = [
        replica
        for replica in REPLICAS
        if len({s.group for s in affine.served if s.replica == replica}) <= SLOTS
    ]
    assert roomy  # both replicas serve groups (above), and there are 2 * SLOTS of them
    seen: set[int] = set()
    for request in (s for s in affine.served if s.replica in roomy):
        if request.group in seen:
            assert request.cached_tokens >= request.prompt_tokens - TURN_TOKENS, request
        else:
            assert request.cached_tokens < TURN_TOKENS, request
        seen.add(request.group)


def test_host_prompt_cache_narrows_the_gap(
    runs: dict[str, RouterRun], host_cache_runs: dict[str, RouterRun]
) -> None:
    """With llama-server's default ``--cache-ram`` a replica restores any prompt it has
    seen from host memory into whichever slot it picks: ``least_inflight`` reuses more
    than on slots alone, ``prefix_affinity`` still more (it misses once per group, not
    once per group and replica), and the gap between them is smaller than on slots alone."""
    affine, spread = host_cache_runs["prefix_affinity"], host_cache_runs["least_inflight"]
    assert spread.cached_total > runs["least_inflight"].cached_total
    assert affine.cached_total > spread.cached_total
    slots_gap = runs["prefix_affinity"].cached_total - runs["least_inflight"].cached_total
    assert affine.cached_total - spread.cached_total < slots_gap
