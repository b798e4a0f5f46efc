"""The emulator's KV cache events, published as vLLM publishes them (``--kv-events``).

vLLM's ``ZmqEventPublisher`` (``vllm/distributed/kv_events.py``) sends one
``KVEventBatch`` per engine step that changed its prefix cache on a ZMQ PUB socket, as the
multipart message ``[topic, seq, payload]`` (``seq`` an 8-byte big-endian counter from 0),
and keeps its last batches for a ROUTER replay socket: a DEALER that missed some sends
``["", seq]`` and gets every buffered batch from ``seq`` on, then the end marker. The
emulator does the same with the engine model's prefix cache: after each step it drains the
cache's stores and evictions in order (``PrefixCache.drain_events``), groups consecutive
ones of a kind into ``BlockStored`` / ``BlockRemoved``, and publishes them as one batch
(``engine_profiles.kv_events_wire``: msgpack, events as maps). A start is an engine
restart: the first batch, seq 0, is ``AllBlocksCleared``.

The block hashes are ``core.prefix_blocks.block_hashes`` of the prompt text (the emulator
has no tokenizer), so they equal what the gateway computes for the same request, not what
a real vLLM would send. ``parent_block_hash`` is sent as nil: the prefix cache's drain
does not say which block precedes a stored run (an index keyed by the chained hashes,
like sluicegate's, does not need it), and ``token_ids`` are empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from sluicegate.core.kv_index import AllBlocksCleared, KvEvent, events_of
from sluicegate.engine import Engine
from sluicegate.engine_profiles.kv_events_wire import (
    REPLAY_END,
    KvWireError,
    encode_batch,
    message_frames,
    pack_seq,
    unpack_seq,
)

DEFAULT_REPLAY_BATCHES = 10_000
"""Batches kept for replay (vLLM's ``KVEventsConfig.buffer_steps`` default)."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KvEventsOptions:
    """Where and how the emulator publishes KV events (vLLM's ``--kv-events-config``).

    Attributes:
        endpoint: the PUB socket's address to bind, ``tcp://host:port`` (``port`` may be
            ``*``: the OS picks one, see ``KvEventPublisher.endpoint``).
        replay_endpoint: the ROUTER replay socket's address to bind; None: no replay.
        topic: the first frame of every message (vLLM's default is empty).
        replay_batches: how many of the latest batches the replay socket can send.
    """

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    replay_batches: int = DEFAULT_REPLAY_BATCHES

    def __post_init__(self) -> None:
        for name, address in (("endpoint", self.endpoint), ("replay", self.replay_endpoint)):
            if address is not None and not address.startswith("tcp://"):
                raise ValueError(f"KV events {name} must be tcp://host:port, got {address!r}")
        if self.replay_batches < 1:
            raise ValueError(f"replay_batches must be >= 1, got {self.replay_batches}")


class KvEventPublisher:
    """Publishes an engine's prefix-cache changes on ZMQ, one batch per step that had any.

    Call :meth:`start` on the running loop (it binds, turns the cache's recording on and
    publishes ``AllBlocksCleared`` as seq 0), :meth:`after_step` after each engine step,
    and :meth:`stop` at the end.

    Args:
        options: the sockets and topic.
        engine: the engine whose prefix cache is published.
    """

    def __init__(self, options: KvEventsOptions, engine: Engine) -> None:
        self.options = options
        self._cache = engine.prefix_cache
        self._block_size = engine.config.block_size
        self._topic = options.topic.encode()
        self._ring: deque[tuple[int, bytes]] = deque(maxlen=options.replay_batches)
        self._next_seq = 0
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.Socket[bytes] | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self.endpoint = options.endpoint
        """The PUB socket's bound address (the port the OS chose for ``*``)."""
        self.replay_endpoint = options.replay_endpoint
        """The replay socket's bound address, or None."""

    def start(self) -> None:
        """Bind the sockets, start answering replays, and publish ``AllBlocksCleared``."""
        ctx = self._ctx = zmq.asyncio.Context()
        # A plain socket on the asyncio context: publishing never waits, so needs no future.
        pub: zmq.Socket[bytes] = zmq.Socket(ctx, zmq.PUB)
        self._pub = pub
        pub.setsockopt(zmq.LINGER, 0)
        pub.bind(self.options.endpoint)
        self.endpoint = _bound(pub)
        if self.options.replay_endpoint is not None:
            router = self._router = ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.bind(self.options.replay_endpoint)
            self.replay_endpoint = _bound(router)
            self._replay_task = asyncio.get_running_loop().create_task(self._serve(router))
        self._cache.recording = True
        self._cache.drain_events()
        self.publish([AllBlocksCleared()])

    def after_step(self) -> None:
        """Publish the prefix cache's changes since the last call, if any."""
        events = events_of(self._cache.drain_events())
        if events:
            self.publish(events)

    def publish(self, events: Sequence[KvEvent]) -> None:
        """Send one batch with the next seq and keep it for replay."""
        payload = encode_batch(time.time(), events, 0, block_size=self._block_size)
        seq = self._next_seq
        self._next_seq += 1
        self._ring.append((seq, payload))
        if self._pub is None:
            return
        # A PUB socket drops a message no subscriber can take; it never blocks.
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart(message_frames(self._topic, seq, payload), zmq.NOBLOCK)

    async def stop(self) -> None:
        """Stop answering replays and close the sockets."""
        self._cache.recording = False
        task, self._replay_task = self._replay_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
        for socket in (self._pub, self._router):
            if socket is not None:
                socket.close(linger=0)
        ctx, self._ctx, self._pub, self._router = self._ctx, None, None, None
        if ctx is not None:
            ctx.term()

    def replay_from(self, start: int) -> list[tuple[int, bytes]]:
        """The buffered ``(seq, payload)`` batches from ``start`` on, oldest first."""
        return [(seq, payload) for seq, payload in self._ring if seq >= start]

    async def _serve(self, router: zmq.asyncio.Socket) -> None:
        """Answer each ``[client, "", seq]`` with the batches from ``seq``, then the end."""
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3 or frames[1]:
                _log.warning("KV events replay: a request of %d frames ignored", len(frames))
                continue
            client = frames[0]
            try:
                start = unpack_seq(frames[2])
            except KvWireError as exc:
                _log.warning("KV events replay: %s", exc)
                continue
            for seq, payload in self.replay_from(start):
                await router.send_multipart([client, b"", pack_seq(seq), payload])
            await router.send_multipart([client, b"", REPLAY_END, b""])


def _bound(socket: zmq.Socket[Any]) -> str:
    address = socket.getsockopt(zmq.LAST_ENDPOINT)
    return address.decode() if isinstance(address, bytes) else str(address)
