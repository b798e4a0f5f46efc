"""The gateway follows engines' KV events (``gateway/ops/kv_subscriber.py``): a real ZMQ
publisher on loopback speaking vLLM's protocol (``tests/gateway/kv_publisher.py``), a real
gateway subscribed to it, and what ``/admin/state`` and ``/metrics`` then say."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import msgpack  # type: ignore[import-untyped]  # ships no type hints
import pytest

from sluicegate.config import parse_config
from sluicegate.core.kv_index import AllBlocksCleared, BlockRemoved, BlockStored
from sluicegate.engine_profiles.kv_events_wire import MAX_PAYLOAD_BYTES, pack_seq
from sluicegate.gateway.app import build_app as build_gateway
from sluicegate.gateway.ops.kv_metrics import OUTCOMES
from sluicegate.gateway.ops.kv_subscriber import KvSubscribers
from sluicegate.gateway.state import GatewayState
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    MODEL,
    backend_state,
    http_call,
    metric,
    start_server,
    stop_servers,
    unused_port,
    wait_until,
)
from tests.gateway.kv_publisher import KvPublisher


@dataclass(frozen=True)
class Rig:
    """A publisher and the gateway subscribed to it (backend ``e0``)."""

    base_url: str
    publisher: KvPublisher

    def blocks(self) -> int | None:
        """``kv_index_blocks`` of ``e0`` in ``/admin/state``."""
        value: int | None = backend_state(self.base_url, "e0")["kv_index_blocks"]
        return value

    def counts(self) -> dict[str, float]:
        """``sluicegate_kv_events_total`` of ``e0`` per outcome."""
        found: dict[str, float] = {}
        for outcome in OUTCOMES:
            value = metric(
                self.base_url, "sluicegate_kv_events_total", backend="e0", outcome=outcome
            )
            assert value is not None, outcome
            found[outcome] = value
        return found

    def settle(self, blocks: int, **counts: float) -> None:
        """Wait until the index holds ``blocks`` and the counts reach ``counts`` (the other
        outcomes staying 0), then check both."""
        expected = dict.fromkeys(OUTCOMES, 0.0) | counts
        assert wait_until(lambda: self.counts() == expected and self.blocks() == blocks, 4.0), (
            self.counts(),
            self.blocks(),
        )


@contextmanager
def rig(*, replay: str = "up", max_blocks: int = 1000) -> Iterator[Rig]:
    """A publisher and a gateway (no engine behind it, no scrapes) following it; its
    replay socket ``up``, configured but ``down`` (nothing listens), or ``none``."""
    with KvPublisher(replay=replay == "up") as publisher:
        replay_endpoint = {
            "up": publisher.replay_endpoint,
            "down": f"tcp://127.0.0.1:{unused_port()}",
            "none": None,
        }[replay]
        replay_line = f", replay_endpoint: '{replay_endpoint}'" if replay_endpoint else ""
        config = parse_config(
            f"models:\n  - name: {MODEL}\n    backends:\n"
            f"      - name: e0\n        url: 'http://127.0.0.1:{unused_port()}'\n"
            f"        kv_events: {{endpoint: '{publisher.endpoint}'{replay_line},"
            f" topic: kv-events, max_blocks: {max_blocks}}}\n"
        )
        app = build_gateway(config, environ={"SLUICEGATE_ADMIN_KEY": ADMIN_KEY}, scrape=False)
        running = start_server(app)
        try:
            publisher.wait_subscribed()
            yield Rig(f"http://127.0.0.1:{running.port}", publisher)
        finally:
            stop_servers([running])


def test_events_reach_admin_state_and_metrics() -> None:
    """Before any event the index is absent (null); stored and removed blocks then show
    in ``kv_index_blocks`` and in the ``sluicegate_kv_index_blocks`` gauge."""
    with rig() as live:
        assert live.blocks() is None
        assert metric(live.base_url, "sluicegate_kv_index_blocks", backend="e0") == 0
        live.publisher.publish([BlockStored((1, 2, 3)), BlockStored((4,), parent=3)])
        live.publisher.publish([BlockRemoved((2, 99))])
        live.settle(3, applied=2)
        assert metric(live.base_url, "sluicegate_kv_index_blocks", backend="e0") == 3


def test_a_gap_is_replayed() -> None:
    """A batch the subscriber missed is asked from the replay socket from the first missed
    sequence number, and applied before the batch that showed the gap."""
    with rig() as live:
        live.publisher.publish([BlockStored((1,))])
        live.publisher.publish([BlockStored((2, 3))], send=False)
        live.publisher.publish([BlockStored((4,)), BlockRemoved((1,))])
        live.settle(3, applied=2, gap=1, replayed=1)
        assert live.publisher.replay_requests == [1]


@pytest.mark.parametrize("replay", ["up", "down", "none"])
def test_a_gap_no_replay_fills_clears_the_index(replay: str) -> None:
    """A gap the replay cannot fill (its buffer lost the batch), with the replay socket
    down (within its 1 s timeout), or with none: the index is cleared, then the batch that
    showed the gap is applied."""
    with rig(replay=replay) as live:
        live.publisher.publish([BlockStored((1, 2))])
        lost = live.publisher.publish([BlockStored((3,))], send=False)
        del live.publisher.buffer[lost]
        live.publisher.publish([BlockStored((4, 5, 6))])
        live.settle(3, applied=2, gap=1, reset=1)
        assert live.publisher.replay_requests == ([1] if replay == "up" else [])


def test_sequence_going_back_clears_the_index() -> None:
    """An engine restart (numbering from 0 again) clears the index; the new batch applies."""
    with rig() as live:
        live.publisher.publish([BlockStored((1, 2))])
        live.publisher.publish([BlockStored((3,))])
        live.settle(3, applied=2)
        live.publisher.restart()
        live.publisher.publish([BlockStored((7,))])
        live.settle(1, applied=3, reset=1)


def test_all_blocks_cleared_clears_the_index() -> None:
    """``AllBlocksCleared`` empties the index; the events after it in the batch apply."""
    with rig() as live:
        live.publisher.publish([BlockStored((1, 2, 3))])
        live.publisher.publish([AllBlocksCleared(), BlockStored((8, 9))])
        live.settle(2, applied=2)


def test_hostile_frames_are_counted_and_dropped() -> None:
    """Wrong frame counts, short sequence frames, garbage payloads, huge array headers and
    wrong types are counted as malformed; the gateway answers throughout; one with a good
    sequence number but a bad payload clears the index (its events are lost)."""
    with rig() as live:
        pub = live.publisher
        topic = pub.topic
        pub.publish([BlockStored((1, 2))])
        live.settle(2, applied=1)
        for frames in ([topic], [topic, pack_seq(1)], [topic, b"\x00\x01", b"x"],
                       [topic, pack_seq(1), b"", b"extra"]):  # fmt: skip
            pub.send_frames(frames)
        live.settle(2, applied=1, malformed=4)
        bad_payloads = [
            b"\xc1",
            b"\xdd\xff\xff\xff\xff",  # an array claiming 2**32 - 1 items
            msgpack.packb([1.0, [["BlockStored", "not hashes", None, [], 16, None]]]),
            msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [1.5]}]]),
            msgpack.packb(["ts", []]),
        ]
        for payload in bad_payloads:
            pub.send_frames([topic, pack_seq(pub.next_seq), payload])
            pub.next_seq += 1
        live.settle(0, applied=1, malformed=9, reset=5)
        pub.publish([BlockStored((5,))])
        live.settle(1, applied=2, malformed=9, reset=5)
        assert http_call(live.base_url, "GET", "/healthz").status == 200


def test_an_oversized_message_disconnects_and_the_stream_resumes() -> None:
    """A frame over ``MAX_PAYLOAD_BYTES`` never reaches the decoder: ZMQ drops the
    connection, the index is cleared, and after the reconnect batches apply again."""
    with rig() as live:
        pub = live.publisher
        pub.publish([BlockStored((1, 2))])
        live.settle(2, applied=1)
        pub.send_frames([pub.topic, pack_seq(pub.next_seq), b"\x00" * (MAX_PAYLOAD_BYTES + 1)])
        live.settle(0, applied=1, reset=1)
        pub.wait_subscribed()
        pub.publish([BlockStored((3,))])
        live.settle(1, applied=2, reset=1)


def test_a_flood_keeps_the_index_bounded_and_the_gateway_answering() -> None:
    """3000 batches of 20 new blocks each at full speed: the index never holds more than
    ``max_blocks``, every batch is applied, and ``/healthz`` answers within 0.5 s during
    the flood."""
    with rig(max_blocks=500) as live:
        pub = live.publisher
        for i in range(3000):
            pub.publish([BlockStored(tuple(range(i * 20, i * 20 + 20)))])
            if i % 500 == 0:
                started = time.monotonic()
                assert http_call(live.base_url, "GET", "/healthz").status == 200
                assert time.monotonic() - started < 0.5
                blocks = live.blocks()
                assert blocks is None or blocks <= 500
        live.settle(500, applied=3000)


async def test_subscribers_stop_cleanly() -> None:
    """``stop`` ends every stream's task and closes the ZMQ context, with a batch applied
    before; ``of`` gives None when no backend has ``kv_events``."""
    with KvPublisher() as publisher:
        config = parse_config(
            f"models:\n  - name: {MODEL}\n    backends:\n"
            f"      - {{name: e0, url: 'http://127.0.0.1:1', kv_events: {{endpoint:"
            f" '{publisher.endpoint}', topic: kv-events}}}}\n"
            f"      - {{name: e1, url: 'http://127.0.0.1:2'}}\n"
        )
        state = GatewayState(config, {})
        subscribers = KvSubscribers.of(state)
        assert subscribers is not None
        assert [(s.model, s.backend) for s in subscribers.streams] == [(MODEL, "e0")]
        subscribers.start()
        await asyncio.to_thread(publisher.wait_subscribed)
        publisher.publish([BlockStored((1, 2))])
        for _ in range(200):
            if state.scheduler.view(MODEL).backends[0].kv_index_blocks == 2:
                break
            await asyncio.sleep(0.01)
        assert state.scheduler.view(MODEL).backends[0].kv_index_blocks == 2
        tasks = list(subscribers.tasks)
        await subscribers.stop()
        assert all(task.done() for task in tasks)
        assert subscribers.closed
    plain = parse_config(
        f"models:\n  - name: {MODEL}\n    backends: [{{name: e0, url: 'http://h:1'}}]\n"
    )
    assert KvSubscribers.of(GatewayState(plain, {})) is None
