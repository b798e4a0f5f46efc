"""KV event subscribers: each backend with ``kv_events:`` followed over ZMQ, its events fed
to the scheduler's block index (DESIGN §8, "KV events").

One ``BackendKvStream`` per backend: a SUB socket on the engine's PUB ``endpoint``
(``ZMQ_MAXMSGSIZE`` refuses frames over the decoder's bound, the receive high-water mark
bounds what waits), messages ``[topic, seq, payload]`` decoded by
``engine_profiles/kv_events_wire.py``. The sequence decides what the index can trust:

- ``seq`` one past the last: the batch is applied (``applied``);
- a gap: the missed batches are asked from the engine's replay socket (a DEALER to its
  ROUTER, from the last seen ``seq + 1``) and applied (``replayed``); a replay that is
  missing, malformed, short or late clears the index instead (``gap``, then ``reset``);
- ``seq`` at or below the last (the engine restarted and counts from 0 again), a
  disconnect seen by the socket monitor (the socket is then opened again), or a batch
  whose payload is malformed: the index is cleared (``reset``), since its events no
  longer describe the engine.

Anything malformed is counted and dropped; nothing a publisher sends stops the loop.
Every message yields to the event loop, so a flood costs CPU, never the gateway's
responsiveness, and the index stays within its ``max_blocks``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from sluicegate.core.component_specs import KvEventsSpec
from sluicegate.core.kv_index import AllBlocksCleared, KvEvent
from sluicegate.engine_profiles.kv_events_wire import (
    MAX_PAYLOAD_BYTES,
    KvWireError,
    decode_batch,
    is_replay_end,
    pack_seq,
    split_message,
    unpack_seq,
)
from sluicegate.gateway.asyncio_driver import SchedulerDriver
from sluicegate.gateway.ops.kv_metrics import KvEventMetrics, Outcome
from sluicegate.gateway.state import GatewayState

log = logging.getLogger(__name__)

RECEIVE_HWM = 32
"""Messages waiting per socket (each at most ``MAX_PAYLOAD_BYTES``): ~0.3 s of a busy
engine's steps; more is a gap, which a replay fills."""
RECONNECT_MS, RECONNECT_MAX_MS = 100, 2000
REPLAY_REPLY_TIMEOUT_MS = 1000
REPLAY_DEADLINE_S = 5.0
MAX_REPLAY_BATCHES = 10_000
"""The longest gap asked of a replay (vLLM keeps its last 10 000 batches); a longer one
clears the index at once."""


def _open(ctx: zmq.asyncio.Context, kind: int, endpoint: str) -> zmq.asyncio.Socket:
    socket = ctx.socket(kind)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.MAXMSGSIZE, MAX_PAYLOAD_BYTES)
    socket.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
    socket.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
    socket.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_MAX_MS)
    socket.connect(endpoint)
    return socket


class BackendKvStream:
    """One backend's KV event stream, followed into the scheduler until cancelled."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        model: str,
        backend: str,
        spec: KvEventsSpec,
        driver: SchedulerDriver,
        metrics: KvEventMetrics,
    ) -> None:
        self._ctx = ctx
        self.model = model
        self.backend = backend
        self.spec = spec
        self._topic = spec.topic.encode()
        self._driver = driver
        self._metrics = metrics
        self.last_seq: int | None = None

    async def run(self) -> None:
        """Receive, check and apply batches until cancelled; after an unexpected error the
        index is cleared and the sockets opened again a second later."""
        while True:
            try:
                await self._follow()
                await asyncio.sleep(RECONNECT_MS / 1000)
            except Exception:
                log.exception("KV events of %s/%s: subscriber failed", *self._key())
                self.reset()
                await asyncio.sleep(1.0)

    async def _follow(self) -> None:
        """Follow the stream on a new SUB socket until its connection drops. The socket is
        not left to reconnect by itself: after a protocol error (a frame over
        ``ZMQ_MAXMSGSIZE``) libzmq ends the session for good."""
        sub = _open(self._ctx, zmq.SUB, self.spec.endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while True:
                ready = dict(await poller.poll())
                if monitor in ready and await self._disconnected(monitor):
                    log.info("KV events of %s/%s: publisher disconnected", *self._key())
                    self.reset()
                    return
                if sub in ready:
                    await self.on_message(await sub.recv_multipart())
                await asyncio.sleep(0)
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _disconnected(self, monitor: zmq.asyncio.Socket) -> bool:
        event = parse_monitor_message(await monitor.recv_multipart())
        return bool(event["event"] == zmq.EVENT_DISCONNECTED)

    async def on_message(self, frames: Sequence[bytes]) -> None:
        """One PUB message: applied, replayed up to, or reset on, by its sequence."""
        try:
            topic, seq, payload = split_message(frames)
        except KvWireError:
            self._count("malformed")
            return
        if topic != self._topic:
            return  # a longer topic sharing our prefix (ZMQ subscriptions match prefixes)
        last = self.last_seq
        if last is not None and seq > last + 1:
            self._count("gap")
            if not await self._replay(last + 1, seq):
                self.reset()
        elif last is not None and seq <= last:
            log.info("KV events of %s/%s: sequence went back (engine restart)", *self._key())
            self.reset()
        self.last_seq = seq
        if not self._apply(payload, "applied"):
            self.reset()
            self.last_seq = seq  # the next batch follows this one: no gap to replay

    def reset(self) -> None:
        """Forget the engine's blocks and where its sequence was."""
        self._count("reset")
        self.last_seq = None
        self._feed([AllBlocksCleared()])

    def _apply(self, payload: bytes, outcome: Outcome) -> bool:
        """Decode and apply one batch; False (counted ``malformed``) if it is malformed."""
        try:
            _, events = decode_batch(payload)
        except KvWireError as exc:
            log.debug("KV events of %s/%s: malformed batch: %s", *self._key(), exc)
            self._count("malformed")
            return False
        self._feed(events)
        self._count(outcome)
        return True

    async def _replay(self, start: int, stop: int) -> bool:
        """Apply batches ``start`` to ``stop - 1`` from the replay socket; whether all came."""
        endpoint = self.spec.replay_endpoint
        if endpoint is None or stop - start > MAX_REPLAY_BATCHES:
            return False
        dealer = _open(self._ctx, zmq.DEALER, endpoint)
        try:
            async with asyncio.timeout(REPLAY_DEADLINE_S):
                # A DEALER with no peer blocks on send: the replay socket is down.
                request = dealer.send_multipart([b"", pack_seq(start)])
                await asyncio.wait_for(request, REPLAY_REPLY_TIMEOUT_MS / 1000)
                return await self._receive_replay(dealer, start, stop)
        except TimeoutError:
            log.info("KV events of %s/%s: replay timed out", *self._key())
            return False
        except KvWireError as exc:
            log.info("KV events of %s/%s: malformed replay: %s", *self._key(), exc)
            self._count("malformed")
            return False
        finally:
            dealer.close(linger=0)

    async def _receive_replay(self, dealer: zmq.asyncio.Socket, start: int, stop: int) -> bool:
        expected = start
        while expected < stop:
            if not await dealer.poll(REPLAY_REPLY_TIMEOUT_MS):
                return False
            frames = await dealer.recv_multipart()
            if len(frames) != 3 or frames[0]:
                self._count("malformed")
                return False
            if is_replay_end(frames[1], frames[2]):
                return False  # the engine's buffer no longer reaches back to ``start``
            seq = unpack_seq(frames[1])
            if seq < expected:
                continue
            if seq > expected or not self._apply(frames[2], "replayed"):
                return False
            expected += 1
            await asyncio.sleep(0)
        return True

    def _feed(self, events: Sequence[KvEvent]) -> None:
        self._driver.observe_kv_events(self.model, self.backend, events, self.spec.max_blocks)

    def _count(self, outcome: Outcome) -> None:
        self._metrics.count(self.model, self.backend, outcome)

    def _key(self) -> tuple[str, str]:
        return self.model, self.backend


class KvSubscribers:
    """The streams of every backend with ``kv_events:``, started and stopped together."""

    def __init__(
        self, state: GatewayState, backends: Sequence[tuple[str, str, KvEventsSpec]]
    ) -> None:
        self._ctx = zmq.asyncio.Context()
        self.metrics = KvEventMetrics(
            state.metrics.registry, state.scheduler, [(m, b) for m, b, _ in backends]
        )
        self.streams = [
            BackendKvStream(self._ctx, model, backend, spec, state.driver, self.metrics)
            for model, backend, spec in backends
        ]
        self.tasks: list[asyncio.Task[None]] = []

    @classmethod
    def of(cls, state: GatewayState) -> KvSubscribers | None:
        """Subscribers for ``state``'s config, or None when no backend has ``kv_events``."""
        backends = [
            (model.name, backend.name, backend.kv_events)
            for model in state.config.models
            for backend in model.backends
            if backend.kv_events is not None
        ]
        return cls(state, backends) if backends else None

    @property
    def closed(self) -> bool:
        """Whether ``stop`` closed the sockets (they cannot start again)."""
        return bool(self._ctx.closed)

    def start(self) -> None:
        """Start following every stream (on the running loop)."""
        self.tasks = [asyncio.create_task(stream.run()) for stream in self.streams]

    async def stop(self) -> None:
        """Stop every stream and close their sockets."""
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.tasks = []
        self._ctx.destroy(linger=0)
