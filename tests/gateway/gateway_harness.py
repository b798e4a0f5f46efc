"""Real servers on loopback for gateway tests: emulated engines and the gateway itself.

Each server is a real uvicorn on 127.0.0.1 with an OS-chosen port, running in
a background thread; tests talk to it over HTTP with the official openai SDK,
aiohttp or raw sockets.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import uvicorn
from starlette.types import ASGIApp

from sluicegate.config import Config, parse_config
from sluicegate.emulator import build_app as build_emulator
from sluicegate.engine import EngineConfig, preset
from sluicegate.gateway.app import build_app as build_gateway

MODEL = "tiny"
ADMIN_KEY = "admin-secret-canary"


@dataclass(frozen=True)
class _Running:
    server: uvicorn.Server
    thread: threading.Thread
    port: int


def _start(app: ASGIApp) -> _Running:
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=0, loop="uvloop", http="httptools", ws="none",
            lifespan="on", log_level="warning", access_log=False, timeout_graceful_shutdown=2,
        )
    )  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("server did not start")
        time.sleep(0.005)
    return _Running(server, thread, int(server.servers[0].sockets[0].getsockname()[1]))


def _stop(running: Sequence[_Running]) -> None:
    """Stop servers together: each takes ~0.2 s of uvicorn ticks to wind down."""
    for one in running:
        one.server.should_exit = True
    for one in running:
        one.thread.join(timeout=10)


@contextmanager
def serve_in_thread(app: ASGIApp) -> Iterator[int]:
    """Serve ``app`` with uvicorn on 127.0.0.1; yield its port; stop it cleanly."""
    running = _start(app)
    try:
        yield running.port
    finally:
        _stop([running])


def engine_config(**overrides: int | float) -> EngineConfig:
    """The ``tiny`` preset with overrides (e.g. a smaller ``max_num_seqs``)."""
    from dataclasses import replace

    return replace(preset("tiny"), **overrides)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Stack:
    """A gateway in front of emulated engines."""

    gateway_port: int
    engine_ports: tuple[int, ...]
    config: Config

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def engine_url(self, i: int = 0) -> str:
        return f"http://127.0.0.1:{self.engine_ports[i]}"


def engine_stats(url: str) -> dict[str, float]:
    """An emulator's ``/emulator/stats``."""
    import urllib.request

    with urllib.request.urlopen(url + "/emulator/stats", timeout=5) as response:
        data: dict[str, float] = orjson.loads(response.read())
    return data


def gateway_config(engine_ports: Sequence[int], body: str) -> Config:
    """A config whose single model ``tiny`` has one backend per engine port.

    ``body`` is YAML appended under the model (indented by the caller as
    model keys: ``max_concurrency``, ``lanes``…) followed by top-level keys.
    """
    backends = "".join(
        f"      - {{name: e{i}, url: 'http://127.0.0.1:{port}', engine: emulator}}\n"
        for i, port in enumerate(engine_ports)
    )
    text = f"models:\n  - name: {MODEL}\n    backends:\n{backends}{body}"
    return parse_config(text)


@contextmanager
def stack(
    body: str = "",
    *,
    engines: int = 1,
    engine: EngineConfig | None = None,
    environ: Mapping[str, str] | None = None,
    scrape: bool = True,
) -> Iterator[Stack]:
    """``engines`` emulators and a gateway configured with ``body`` in front of them."""
    running: list[_Running] = []
    try:
        for i in range(engines):
            emulator = build_emulator(engine or preset("tiny"), model=MODEL, seed=i)
            running.append(_start(emulator))
        ports = [one.port for one in running]
        config = gateway_config(ports, body)
        env = {"SLUICEGATE_ADMIN_KEY": ADMIN_KEY, **(environ or {})}
        app = build_gateway(config, environ=env, scrape=scrape)
        running.append(_start(app))
        yield Stack(running[-1].port, tuple(ports), config)
    finally:
        _stop(running)


# Model keys that make the scheduler's service-time priors short, so the
# Retry-After it derives from them is the 1 s minimum rather than seconds of
# an imagined 40 tokens/s engine.
FAST_PRIORS = "    prior_output_tokens: 16\n    prior_decode_tokens_per_s: 100000.0\n"


@dataclass(frozen=True)
class Reply:
    """A raw HTTP answer: status, headers (names lower-cased) and body bytes."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON."""
        return orjson.loads(self.body)


def http_call(
    base_url: str,
    method: str,
    path: str,
    *,
    json: object = None,
    body: bytes | None = None,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> Reply:
    """One HTTP request over a fresh connection, with full control of body and headers.

    ``json`` is serialised with orjson; ``body`` is sent as is; ``key`` becomes
    ``Authorization: Bearer key``.
    """
    host, _, port = base_url.removeprefix("http://").partition(":")
    all_headers = dict(headers or {})
    if key is not None:
        all_headers["Authorization"] = f"Bearer {key}"
    if json is not None:
        body = orjson.dumps(json)
        all_headers.setdefault("Content-Type", "application/json")
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=all_headers)
        response = connection.getresponse()
        data = response.read()
        names = {name.lower(): value for name, value in response.getheaders()}
        return Reply(response.status, names, data)
    finally:
        connection.close()


ERROR_FIELDS = frozenset({"message", "type", "code", "param"})


def openai_error(reply: Reply) -> dict[str, Any]:
    """The ``error`` object of an OpenAI-shaped error body; AssertionError if it is not one.

    The shape is ``{"error": {"message": str, "type": str, "code": str, "param": str|null}}``
    with a JSON content type.
    """
    assert reply.headers.get("content-type", "").startswith("application/json"), reply.headers
    data = reply.json()
    assert isinstance(data, dict), data
    assert set(data) == {"error"}, data
    error = data["error"]
    assert isinstance(error, dict), data
    assert set(error) == ERROR_FIELDS, error
    for field in ("message", "type", "code"):
        assert isinstance(error[field], str), error
        assert error[field], error
    assert error["param"] is None or isinstance(error["param"], str)
    return error


def assert_retry_headers(reply: Reply) -> None:
    """``Retry-After`` is an integer ≥ 1 and ``retry-after-ms`` an integer ≥ 1000 that agrees."""
    seconds = reply.headers["retry-after"]
    millis = reply.headers["retry-after-ms"]
    assert seconds.isdigit(), seconds
    assert millis.isdigit(), millis
    assert int(seconds) >= 1, seconds
    assert int(millis) >= 1000, millis
    assert (int(seconds) - 1) * 1000 <= int(millis) <= int(seconds) * 1000, (seconds, millis)


def admin_state(base_url: str) -> dict[str, Any]:
    """The gateway's ``/admin/state`` (with the admin key)."""
    reply = http_call(base_url, "GET", "/admin/state", key=ADMIN_KEY)
    assert reply.status == 200, reply
    data: dict[str, Any] = reply.json()
    return data


def model_state(base_url: str) -> dict[str, Any]:
    """The ``tiny`` model's entry of ``/admin/state``."""
    models: list[dict[str, Any]] = admin_state(base_url)["models"]
    return next(model for model in models if model["name"] == MODEL)


def wait_until(predicate: Callable[[], bool], within_s: float, every_s: float = 0.01) -> bool:
    """Poll ``predicate`` until it holds; False if it still does not after ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every_s)
    return predicate()


async def open_stream(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    events: int = 1,
    max_tokens: int = 5000,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> aiohttp.ClientResponse:
    """Start a streamed ``ignore_eos`` completion and read its first ``events`` data events.

    Once this returns the request is admitted and generating; it holds its slot
    until the caller closes the response (which disconnects) or it finishes.
    """
    all_headers = dict(headers or {})
    if key is not None:
        all_headers["Authorization"] = f"Bearer {key}"
    body = {
        "model": MODEL, "prompt": "hold", "max_tokens": max_tokens,
        "ignore_eos": True, "stream": True,
    }  # fmt: skip
    response = await session.post(base_url + "/v1/completions", json=body, headers=all_headers)
    assert response.status == 200, await response.read()
    seen = 0
    while seen < events:
        line = await response.content.readline()
        assert line, "the stream ended early"
        seen += line.startswith(b"data:")
    return response


def unused_port() -> int:
    """A loopback port nothing listens on (bound once by the OS, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def gateway_at(
    engine_ports: Sequence[int],
    body: str = "",
    *,
    environ: Mapping[str, str] | None = None,
    scrape: bool = True,
) -> Iterator[Stack]:
    """A gateway alone, with backends at ``engine_ports`` (e.g. ones nothing listens on)."""
    config = gateway_config(engine_ports, body)
    env = {"SLUICEGATE_ADMIN_KEY": ADMIN_KEY, **(environ or {})}
    running = _start(build_gateway(config, environ=env, scrape=scrape))
    try:
        yield Stack(running.port, tuple(engine_ports), config)
    finally:
        _stop([running])


def outcomes(base_url: str) -> dict[str, float]:
    """``sluicegate_requests_total`` of the model summed per outcome, from ``/metrics``."""
    from prometheus_client.parser import text_string_to_metric_families

    text = http_call(base_url, "GET", "/metrics").body.decode()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sluicegate_requests_total" and sample.labels["model"] == MODEL:
                outcome = sample.labels["outcome"]
                counts[outcome] = counts.get(outcome, 0.0) + sample.value
    return counts
