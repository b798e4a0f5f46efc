"""The emulator's prefix caching and its KV events (vLLM's wire format), on a real emulator
served by uvicorn and real ZMQ sockets on loopback."""

from __future__ import annotations

import dataclasses
import itertools
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import orjson
import pytest
import zmq
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from sluicegate.cli import app
from sluicegate.core.kv_index import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from sluicegate.core.kv_index import events_of as group_events
from sluicegate.core.prefix_blocks import block_hashes, prompt_text
from sluicegate.demo.processes import free_port
from sluicegate.emulator.kv_event_publisher import KvEventsOptions
from sluicegate.engine import preset
from sluicegate.engine_profiles.kv_events_wire import (
    decode_batch,
    is_replay_end,
    pack_seq,
    split_message,
)
from tests.distributed.cluster import spawn, stop_children, wait_ready
from tests.emulator.emulator_harness import MODEL, LiveEmulator

StartEmulator = Callable[..., AbstractContextManager[LiveEmulator]]
LOOPBACK = KvEventsOptions("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
# A slow prefill (0.1 ms a token) makes a skipped one plain in the request's latency.
SLOW_PREFILL = dataclasses.replace(preset("tiny"), per_prefill_token_s=1e-4)
SYSTEM = "You are a careful assistant for the billing team. " * 360  # 18,000 characters
BLOCK_CHARS = 16 * 4  # a block of 16 tokens of 4 characters


def post(live: LiveEmulator, path: str, body: dict[str, object]) -> float:
    """POST ``body``; the seconds until the whole (non-streamed) answer arrived."""
    request = urllib.request.Request(
        live.base_url + path, data=orjson.dumps({"model": MODEL, **body}),
        headers={"content-type": "application/json"},
    )  # fmt: skip
    start = time.monotonic()
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.status == 200
        resp.read()
    return time.monotonic() - start


def counters(live: LiveEmulator, metrics_path: str = "/metrics") -> dict[str, float]:
    """Every sample of the emulator's metrics by name (labels dropped)."""
    with urllib.request.urlopen(live.base_url + metrics_path, timeout=5) as resp:
        text = resp.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def chat(question: str) -> dict[str, object]:
    """A one-token chat request: the shared system prompt, then ``question``."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return {"messages": messages, "max_tokens": 1}


def shared_tokens(first: dict[str, object], second: dict[str, object]) -> int:
    """Tokens in the full blocks the two prompts' texts share from their start."""
    a, b = prompt_text(first), prompt_text(second)
    common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
    return common // BLOCK_CHARS * 16


def chat_tokens(body: dict[str, object]) -> int:
    """The emulator's prompt size of a chat body: its contents' characters over 4, rounded up."""
    messages = body["messages"]
    assert isinstance(messages, list)
    return -(-sum(len(m["content"]) for m in messages) // 4)


def test_a_shared_system_prompt_is_not_prefilled_twice(start_emulator: StartEmulator) -> None:
    """Two chats sharing an 18,000-character system prompt on an engine prefilling 0.1 ms a
    token: the first takes at least its 0.45 s prefill, the second under half as long (its
    cached blocks are skipped); ``vllm:prefix_cache_hits_total`` counts exactly the tokens of
    the full blocks the prompts share, ``vllm:prefix_cache_queries_total`` both prompts, and
    ``/emulator/stats`` their ratio."""
    first, second = chat("A: what is due in May?"), chat("B: and in June?")
    with start_emulator(SLOW_PREFILL) as live:
        cold = post(live, "/v1/chat/completions", first)
        warm = post(live, "/v1/chat/completions", second)
        metrics = counters(live)
        stats = live.stats()
    queried = chat_tokens(first) + chat_tokens(second)
    hits = shared_tokens(first, second)
    assert hits == len(SYSTEM) // BLOCK_CHARS * 16  # "system:" and "\nuser:" are shared too
    assert cold >= 1e-4 * chat_tokens(first)
    assert warm < cold / 2, (cold, warm)
    assert metrics["vllm:prefix_cache_hits_total"] == hits
    assert metrics["vllm:prefix_cache_queries_total"] == queried
    assert stats["prefix_cache_hit_tokens"] == hits
    assert stats["prefix_cache_query_tokens"] == queried
    assert stats["prefix_cache_hit_rate"] == hits / queried


def test_sglang_counts_the_cached_tokens(start_emulator: StartEmulator) -> None:
    """As SGLang, the same two chats leave ``sglang:cached_tokens_total`` at the shared
    blocks' tokens."""
    first, second = chat("A: what is due in May?"), chat("B: and in June?")
    with start_emulator(preset("tiny"), persona="sglang") as live:
        post(live, "/v1/chat/completions", first)
        post(live, "/v1/chat/completions", second)
        metrics = counters(live)
    assert metrics["sglang:cached_tokens_total"] == shared_tokens(first, second)


def test_without_prefix_caching_every_prompt_is_prefilled(start_emulator: StartEmulator) -> None:
    """``prefix_caching=False`` (``--no-prefix-caching``): the second chat prefills the whole
    shared prompt again (at least its 0.45 s) and nothing is queried or hit."""
    with start_emulator(SLOW_PREFILL, prefix_caching=False) as live:
        post(live, "/v1/chat/completions", chat("A: what is due in May?"))
        warm = post(live, "/v1/chat/completions", chat("B: and in June?"))
        metrics = counters(live)
    assert warm >= 1e-4 * chat_tokens(chat("B: and in June?"))
    assert metrics["vllm:prefix_cache_hits_total"] == 0
    assert metrics["vllm:prefix_cache_queries_total"] == 0


@contextmanager
def subscriber(endpoint: str, topic: bytes = b"") -> Iterator[zmq.Socket[bytes]]:
    """A SUB socket on ``endpoint``, given time to subscribe before anything is published."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(endpoint)
    time.sleep(0.5)  # ZMQ's slow joiner: a subscription takes a moment to reach the PUB
    try:
        yield sub
    finally:
        sub.close(linger=0)
        ctx.term()


def receive(sub: zmq.Socket[bytes]) -> tuple[bytes, int, bytes]:
    """The next ``(topic, seq, payload)``; fails after 5 s."""
    assert sub.poll(5000), "no KV event batch within 5 s"
    return split_message(sub.recv_multipart())


def replay(endpoint: str, start: int) -> list[tuple[int, bytes]]:
    """Ask the replay socket for the batches from ``start`` on, as a DEALER; up to the end
    marker."""
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart([b"", pack_seq(start)])
        batches: list[tuple[int, bytes]] = []
        while True:
            assert dealer.poll(5000), "the replay did not end within 5 s"
            empty, seq, payload = dealer.recv_multipart()
            assert empty == b""
            if is_replay_end(seq, payload):
                return batches
            batches.append((int.from_bytes(seq, "big"), payload))
    finally:
        dealer.close(linger=0)
        ctx.term()


def completion(prompt: str) -> dict[str, object]:
    """A one-token completion of ``prompt``."""
    return {"prompt": prompt, "max_tokens": 1}


def test_block_stored_names_the_prompts_blocks(start_emulator: StartEmulator) -> None:
    """A prompt of 10 full blocks and a bit on a fresh engine: a subscriber gets, as seq 1
    (after the start's ``AllBlocksCleared``), one ``BlockStored`` whose hashes are exactly
    ``block_hashes(prompt_text(body), 16)``."""
    body = completion("The quarterly report, line by line. " * 18)  # 648 characters
    with start_emulator(preset("tiny"), kv_events=LOOPBACK) as live:
        assert live.kv_events is not None
        with subscriber(live.kv_events.endpoint) as sub:
            post(live, "/v1/completions", body)
            topic, seq, payload = receive(sub)
    expected = block_hashes(prompt_text(body), 16)
    assert len(expected) == 10
    assert (topic, seq) == (b"", 1)
    assert decode_batch(payload)[1] == [BlockStored(expected)]


def test_kv_pressure_evicts_the_oldest_blocks(start_emulator: StartEmulator) -> None:
    """On an engine of 64 KV blocks, prompt A (40 blocks) is cached once it ends; prompt B
    (40 blocks) is then admitted into the memory A's cached blocks sit in, so the cache
    keeps 64 - 40 = 24 of A's: B's step's batch removes A's 16 oldest blocks, then stores
    B's 40."""
    small = dataclasses.replace(preset("tiny"), kv_capacity_tokens=64 * 16)
    a, b = completion("a" * 40 * BLOCK_CHARS), completion("b" * 40 * BLOCK_CHARS)
    with start_emulator(small, kv_events=LOOPBACK) as live:
        assert live.kv_events is not None
        with subscriber(live.kv_events.endpoint) as sub:
            post(live, "/v1/completions", a)
            stored_a = decode_batch(receive(sub)[2])[1]
            post(live, "/v1/completions", b)
            evicting = decode_batch(receive(sub)[2])[1]
    hashes_a = block_hashes("a" * 40 * BLOCK_CHARS, 16)
    hashes_b = block_hashes("b" * 40 * BLOCK_CHARS, 16)
    assert stored_a == [BlockStored(hashes_a)]
    assert evicting == [BlockRemoved(hashes_a[:16]), BlockStored(hashes_b)]


def test_replay_returns_missed_batches_and_seq_counts_batches(
    start_emulator: StartEmulator,
) -> None:
    """Three prompts, one batch each: a subscriber sees seqs 1, 2, 3; the replay socket
    answers a request from 0 with seqs 0 to 3 (0 is ``AllBlocksCleared``, the rest byte for
    byte what was published) and one from 2 with seqs 2 and 3."""
    prompts = [f"Prompt number {i}: " + "tell me about the weather. " * 5 for i in range(3)]
    with start_emulator(preset("tiny"), kv_events=LOOPBACK) as live:
        publisher = live.kv_events
        assert publisher is not None
        assert publisher.replay_endpoint is not None
        with subscriber(publisher.endpoint) as sub:
            live_batches = []
            for prompt in prompts:
                post(live, "/v1/completions", completion(prompt))
                _, seq, payload = receive(sub)
                live_batches.append((seq, payload))
        everything = replay(publisher.replay_endpoint, 0)
        tail = replay(publisher.replay_endpoint, 2)
    assert [seq for seq, _ in live_batches] == [1, 2, 3]
    assert [seq for seq, _ in everything] == [0, 1, 2, 3]
    assert decode_batch(everything[0][1])[1] == [AllBlocksCleared()]
    assert everything[1:] == live_batches
    assert tail == live_batches[1:]
    for (_, payload), prompt in zip(live_batches, prompts, strict=True):
        assert decode_batch(payload)[1] == [BlockStored(block_hashes(prompt, 16))]


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 2**64 - 1)), max_size=40))
def test_grouping_keeps_every_change_in_order(changes: list[tuple[bool, int]]) -> None:
    """``group_events`` turns changes into alternating runs: flattened, the runs are the
    changes in order, and no two neighbours are of one kind."""
    events = group_events(changes)
    flat = [(isinstance(e, BlockStored), h) for e in events for h in _hashes(e)]
    assert flat == changes
    kinds = [type(e) for e in events]
    assert all(x is not y for x, y in itertools.pairwise(kinds))
    assert all(_hashes(e) for e in events)


def _hashes(event: KvEvent) -> tuple[int, ...]:
    assert not isinstance(event, AllBlocksCleared)
    return event.hashes


def test_emulate_publishes_kv_events(tmp_path: Path) -> None:
    """``sluicegate emulate --kv-events … --kv-events-replay … --kv-events-topic kv`` (a real
    process): a subscriber to topic ``kv`` gets the prompt's ``BlockStored`` as seq 1, and
    the replay socket sends seq 0, ``AllBlocksCleared``."""
    port, pub, router = free_port(), free_port(), free_port()
    args = [
        "emulate", "--port", str(port), "--model", MODEL,
        "--kv-events", f"tcp://127.0.0.1:{pub}", "--kv-events-replay", f"tcp://127.0.0.1:{router}",
        "--kv-events-topic", "kv",
    ]  # fmt: skip
    child = spawn(f"emulate-{port}", args, port, tmp_path, {})
    body = completion("Summarise the incident report for the on-call team. " * 4)
    try:
        wait_ready([(child, "/health")])
        with subscriber(f"tcp://127.0.0.1:{pub}", b"kv") as sub:
            post(LiveEmulator(port, preset("tiny")), "/v1/completions", body)
            topic, seq, payload = receive(sub)
        first = replay(f"tcp://127.0.0.1:{router}", 0)[0]
    finally:
        stop_children([child])
    assert (topic, seq) == (b"kv", 1)
    assert decode_batch(payload)[1] == [BlockStored(block_hashes(prompt_text(body), 16))]
    assert (first[0], decode_batch(first[1])[1]) == (0, [AllBlocksCleared()])


def test_emulate_refuses_kv_event_flags_that_would_do_nothing() -> None:
    """A replay socket or topic without ``--kv-events``, and KV events with
    ``--no-prefix-caching``, exit 1 saying why."""
    runner = CliRunner()
    alone = runner.invoke(app, ["emulate", "--kv-events-replay", "tcp://127.0.0.1:5558"])
    uncached = runner.invoke(
        app, ["emulate", "--kv-events", "tcp://127.0.0.1:5557", "--no-prefix-caching"]
    )
    assert alone.exit_code == 1
    assert "--kv-events-replay and --kv-events-topic need --kv-events" in alone.output
    assert uncached.exit_code == 1
    assert "KV events need prefix caching" in uncached.output


def test_a_kv_events_endpoint_must_be_tcp() -> None:
    """An endpoint that is not ``tcp://`` is refused when the options are made."""
    with pytest.raises(ValueError, match="KV events endpoint must be tcp://host:port"):
        KvEventsOptions("ipc:///tmp/kv")
    with pytest.raises(ValueError, match="KV events replay must be tcp://host:port"):
        KvEventsOptions("tcp://127.0.0.1:5557", "udp://127.0.0.1:5558")
