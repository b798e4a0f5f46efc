"""End to end: emulators publishing KV events over ZMQ, a gateway subscribed to them, and
``precise_prefix`` routing by what each engine announced (issue 31).

Two in-process emulators (real uvicorn, real ZMQ PUB and replay sockets on loopback,
``emulator/kv_event_publisher.py``), a real gateway whose backends carry ``kv_events:``
(``gateway/ops/kv_subscriber.py``). Nothing is fed by hand: every block the router knows
came from an engine's events. The router's own record of recent decisions is off
(``recent_ttl_s: 0``), so only the events decide; with no cached prefix anywhere (or an
equal one on both engines) it rotates between equally loaded engines, so a run of
sequential chats that all land on one engine is the events' doing.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import orjson

from sluicegate.config import parse_config
from sluicegate.emulator import build_app as build_emulator
from sluicegate.emulator.kv_event_publisher import KvEventPublisher, KvEventsOptions
from sluicegate.engine import preset
from sluicegate.gateway.app import build_app as build_gateway
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    FAST_PRIORS,
    MODEL,
    RunningServer,
    backend_state,
    engine_stats,
    http_call,
    metric,
    start_server,
    stop_servers,
    wait_until,
)

SYSTEM = "You are the support assistant of {who}. Answer from the contract only. " * 60
"""About 4,300 characters: some 67 full blocks of 16 tokens of 4 characters."""
ENGINES = ("e0", "e1")


@dataclass
class Engine:
    """One emulator with its KV event publisher; restartable on the same ports."""

    http_port: int = 0
    endpoints: KvEventsOptions = field(
        default_factory=lambda: KvEventsOptions("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    )
    running: RunningServer | None = None

    def start(self, seed: int) -> None:
        """Serve a fresh emulator (an empty prefix cache) on this engine's ports."""
        app = build_emulator(preset("tiny"), model=MODEL, seed=seed, kv_events=self.endpoints)
        self.running = start_server(app, self.http_port)
        self.http_port = self.running.port
        publisher: KvEventPublisher = app.state.kv_events
        assert publisher.replay_endpoint is not None
        self.endpoints = KvEventsOptions(publisher.endpoint, publisher.replay_endpoint)

    def stop(self) -> None:
        """Stop the emulator; its sockets close with it."""
        if self.running is not None:
            stop_servers([self.running])
            self.running = None

    @property
    def url(self) -> str:
        """Its HTTP base URL."""
        return f"http://127.0.0.1:{self.http_port}"

    def stats(self) -> dict[str, float]:
        """Its ``/emulator/stats``."""
        return engine_stats(self.url)


@dataclass(frozen=True)
class Rig:
    """The engines and the gateway subscribed to their KV events."""

    base_url: str
    engines: tuple[Engine, Engine]

    def index_blocks(self, backend: str) -> int | None:
        """``kv_index_blocks`` of ``backend`` in ``/admin/state``."""
        value: int | None = backend_state(self.base_url, backend)["kv_index_blocks"]
        return value

    def events(self, backend: str, outcome: str) -> float:
        """``sluicegate_kv_events_total`` of ``backend`` with ``outcome``."""
        value = metric(
            self.base_url, "sluicegate_kv_events_total", backend=backend, outcome=outcome
        )
        assert value is not None, (backend, outcome)
        return value

    def admitted(self) -> list[int]:
        """Requests each engine has admitted so far."""
        return [int(engine.stats()["admitted_total"]) for engine in self.engines]

    def chats(self, who: str, count: int) -> list[int]:
        """``count`` sequential chats of ``who``'s system prompt through the gateway, each
        with its own question: how many each engine admitted."""
        before = self.admitted()
        for i in range(count):
            reply = http_call(self.base_url, "POST", "/v1/chat/completions", json=chat(who, i))
            assert reply.status == 200, reply
        return [a - b for a, b in zip(self.admitted(), before, strict=True)]


def chat(who: str, question: int) -> dict[str, object]:
    """A two-token chat: ``who``'s long system prompt, then a short question of its own."""
    messages = [
        {"role": "system", "content": SYSTEM.format(who=who)},
        {"role": "user", "content": f"Question {question}: what does clause {question} say?"},
    ]
    return {"model": MODEL, "messages": messages, "max_tokens": 2, "ignore_eos": True}


def direct(engine: Engine, body: dict[str, object]) -> None:
    """Send ``body`` to ``engine`` itself, past the gateway."""
    request = urllib.request.Request(
        engine.url + "/v1/chat/completions", data=orjson.dumps(body),
        headers={"content-type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        response.read()


def _config(engines: tuple[Engine, Engine]) -> str:
    backends = "".join(
        f"      - name: {name}\n        url: '{engine.url}'\n        engine: emulator\n"
        f"        kv_events: {{endpoint: '{engine.endpoints.endpoint}',"
        f" replay_endpoint: '{engine.endpoints.replay_endpoint}'}}\n"
        for name, engine in zip(ENGINES, engines, strict=True)
    )
    return (
        f"models:\n  - name: {MODEL}\n    backends:\n{backends}"
        "    max_concurrency: 32\n    router: precise_prefix\n"
        "    prefix_routing: {recent_ttl_s: 0}\n"
        f"{FAST_PRIORS}"
        "    lanes:\n      - {name: interactive, max_concurrency: 32}\n"
    )


@contextmanager
def rig() -> Iterator[Rig]:
    """Two emulators publishing KV events and a ``precise_prefix`` gateway following them."""
    engines = (Engine(), Engine())
    gateway: list[RunningServer] = []
    try:
        for seed, engine in enumerate(engines):
            engine.start(seed)
        config = parse_config(_config(engines))
        app = build_gateway(config, environ={"SLUICEGATE_ADMIN_KEY": ADMIN_KEY})
        gateway.append(start_server(app))
        yield Rig(f"http://127.0.0.1:{gateway[0].port}", engines)
    finally:
        stop_servers(gateway)
        for engine in engines:
            engine.stop()


def _warm(live: Rig, backend: str, blocks: int) -> None:
    """Wait until the gateway's index of ``backend`` holds at least ``blocks`` blocks."""
    assert wait_until(lambda: (live.index_blocks(backend) or 0) >= blocks, 5.0), (
        backend,
        live.index_blocks(backend),
    )


def test_chats_follow_the_engine_whose_events_announced_their_prompt() -> None:
    """The first chat of A lands on some engine X, whose events then fill the gateway's
    index; A's next four chats all land on X and hit its prefix cache (the rotation alone
    would split them 2:2). B's prompt, sent to the other engine Y past the gateway, draws
    B's four chats to Y. Every applied batch is counted."""
    with rig() as live:
        first = live.chats("Acme", 1)
        x = first.index(1)
        y = 1 - x
        blocks = len(SYSTEM.format(who="Acme")) // 64
        _warm(live, ENGINES[x], blocks)
        hits_before = live.engines[x].stats()["prefix_cache_hit_tokens"]
        follow_a = live.chats("Acme", 4)
        hits_a = live.engines[x].stats()["prefix_cache_hit_tokens"] - hits_before
        direct(live.engines[y], chat("Bolt", 99))
        _warm(live, ENGINES[y], blocks)
        follow_b = live.chats("Bolt", 4)
        applied = [live.events(name, "applied") for name in ENGINES]
    assert sorted(first) == [0, 1]
    assert follow_a == [4 if i == x else 0 for i in range(2)]
    assert follow_b == [4 if i == y else 0 for i in range(2)]
    assert hits_a >= 4 * blocks * 16
    assert all(count > 0 for count in applied), applied


def test_a_restarted_engine_is_forgotten() -> None:
    """Both engines cached A; engine X restarts (a new emulator on the same HTTP and ZMQ
    ports: its cache is empty and its sequence starts again). The gateway clears X's index
    (``reset`` counted, ``kv_index_blocks`` 0) and A's next four chats all go to Y, the one
    engine still holding A (a stale index would tie the two and rotate 2:2)."""
    with rig() as live:
        x = live.chats("Acme", 1).index(1)
        y = 1 - x
        direct(live.engines[y], chat("Acme", 99))
        blocks = len(SYSTEM.format(who="Acme")) // 64
        _warm(live, ENGINES[x], blocks)
        _warm(live, ENGINES[y], blocks)
        resets = live.events(ENGINES[x], "reset")
        live.engines[x].stop()
        live.engines[x].start(seed=7)
        assert wait_until(
            lambda: (
                live.events(ENGINES[x], "reset") > resets and live.index_blocks(ENGINES[x]) == 0
            ),
            5.0,
        ), (live.events(ENGINES[x], "reset"), live.index_blocks(ENGINES[x]))
        after = live.chats("Acme", 4)
    assert after == [4 if i == y else 0 for i in range(2)]
