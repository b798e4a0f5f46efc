"""A KV event publisher for tests, speaking vLLM's protocol (``vllm/distributed/kv_events.py``,
``ZmqEventPublisher``) on loopback: batches on a PUB-compatible socket as
``[topic, seq, payload]``, and a ROUTER replay socket answering ``["", seq]`` with the
buffered batches from ``seq`` on, then the end marker.

The publishing socket is an XPUB (a PUB that also hears subscriptions) only so that a test
can wait until the gateway has subscribed; what it sends is what a PUB sends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import zmq

from sluicegate.core.kv_index import KvEvent
from sluicegate.engine_profiles.kv_events_wire import (
    REPLAY_END,
    encode_batch,
    message_frames,
    pack_seq,
    unpack_seq,
)


class KvPublisher:
    """PUB and replay sockets on loopback; ``publish`` numbers batches from 0, as vLLM does."""

    def __init__(self, topic: str = "kv-events", *, replay: bool = True) -> None:
        self.topic = topic.encode()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.XPUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self.port = self._pub.bind_to_random_port("tcp://127.0.0.1")
        self.next_seq = 0
        self.buffer: dict[int, bytes] = {}
        self.replay_requests: list[int] = []
        self.replay_port: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if replay:
            router = self._ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            self.replay_port = router.bind_to_random_port("tcp://127.0.0.1")
            self._thread = threading.Thread(target=self._serve_replay, args=(router,), daemon=True)
            self._thread.start()

    @property
    def endpoint(self) -> str:
        """Where the gateway subscribes."""
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def replay_endpoint(self) -> str | None:
        """Where the gateway asks for missed batches (None: no replay socket)."""
        return None if self.replay_port is None else f"tcp://127.0.0.1:{self.replay_port}"

    def wait_subscribed(self, within_s: float = 5.0) -> None:
        """Block until a subscriber's subscription arrives (ZMQ drops what is sent before)."""
        deadline = time.monotonic() + within_s
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not self._pub.poll(left_ms):
                raise TimeoutError("no subscriber")
            if self._pub.recv().startswith(b"\x01"):  # not an unsubscription (\x00)
                return

    def publish(self, events: Sequence[KvEvent], *, send: bool = True) -> int:
        """Encode, buffer and (unless ``send`` is False: a batch the subscriber misses)
        send the next batch; its sequence number."""
        seq = self.next_seq
        self.next_seq += 1
        payload = encode_batch(time.time(), events)
        self.buffer[seq] = payload
        if send:
            self.send_frames(message_frames(self.topic, seq, payload))
        return seq

    def send_frames(self, frames: Sequence[bytes]) -> None:
        """Send any multipart message as it is (hostile tests)."""
        self._pub.send_multipart(list(frames))

    def restart(self) -> None:
        """What an engine restart looks like: numbering from 0 again, an empty buffer."""
        self.next_seq = 0
        self.buffer.clear()

    def _serve_replay(self, router: zmq.Socket[bytes]) -> None:
        try:
            while not self._stop.is_set():
                if not router.poll(20):
                    continue
                identity, _, start = router.recv_multipart()
                first = unpack_seq(start)
                self.replay_requests.append(first)
                for seq in sorted(s for s in list(self.buffer) if s >= first):
                    router.send_multipart([identity, b"", pack_seq(seq), self.buffer[seq]])
                router.send_multipart([identity, b"", REPLAY_END, b""])
        finally:
            router.close(linger=0)

    def close(self) -> None:
        """Stop the replay thread and close the sockets."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._pub.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> KvPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
