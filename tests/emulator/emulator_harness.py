"""Helpers: the emulator served by a real uvicorn on a loopback port, in a background thread."""

from __future__ import annotations

import dataclasses
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import orjson
import uvicorn

from sluicegate.emulator import build_app
from sluicegate.emulator.kv_event_publisher import KvEventPublisher, KvEventsOptions
from sluicegate.engine import EngineConfig

MODEL = "emu-model"


@dataclasses.dataclass(frozen=True)
class LiveEmulator:
    """A running emulator: where to reach it, the engine config it emulates and its KV
    event publisher (None unless started with ``kv_events``)."""

    port: int
    config: EngineConfig
    kv_events: KvEventPublisher | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get_json(self, path: str) -> dict[str, object]:
        with urllib.request.urlopen(self.base_url + path, timeout=5) as resp:
            body: dict[str, object] = orjson.loads(resp.read())
        return body

    def stats(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.get_json("/emulator/stats").items()}  # type: ignore[arg-type]

    def wait_for(self, predicate: Callable[[dict[str, float]], bool], within_s: float) -> bool:
        """Poll ``/emulator/stats`` until ``predicate`` holds; False if it never did in time."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if predicate(self.stats()):
                return True
            time.sleep(0.01)
        return predicate(self.stats())


@contextmanager
def run_emulator(
    config: EngineConfig,
    *,
    seed: int = 0,
    persona: str = "vllm",
    prefix_caching: bool = True,
    kv_events: KvEventsOptions | None = None,
) -> Iterator[LiveEmulator]:
    """Serve ``build_app(config)`` as ``persona`` with uvicorn on 127.0.0.1, port chosen by
    the OS."""
    emulator = build_app(
        config, model=MODEL, seed=seed, persona=persona,
        prefix_caching=prefix_caching, kv_events=kv_events,
    )  # fmt: skip
    server = uvicorn.Server(
        uvicorn.Config(
            emulator, host="127.0.0.1", port=0,
            loop="uvloop", http="httptools", ws="none", lifespan="on",
            log_level="warning", access_log=False, timeout_graceful_shutdown=2,
        )
    )  # fmt: skip
    thread = threading.Thread(target=server.run, name="emulator", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("emulator did not start")
        time.sleep(0.005)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield LiveEmulator(port, config, emulator.state.kv_events)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
