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
from sluicegate.gateway.app import GatewayApp, connection_limits
from sluicegate.gateway.app import build_app as build_gateway
from sluicegate.gateway.edge_protocol import uvicorn_protocol_kwargs

MODEL = "tiny"
ADMIN_KEY = "admin-secret-canary"


@dataclass(frozen=True)
class RunningServer:
    """A uvicorn server running in a background thread, and the port it listens on."""

    server: uvicorn.Server
    thread: threading.Thread
    port: int


def start_server(app: ASGIApp, port: int = 0, *, guarded: bool = True) -> RunningServer:
    """Serve ``app`` with uvicorn on 127.0.0.1 in a thread; return once it listens.

    The gateway runs with its guarded protocol (header/body timeouts, header caps, the
    disconnect callback), as ``sluicegate serve`` does, unless ``guarded`` is False;
    engines with plain httptools.
    """
    http: dict[str, Any] = {"http": "httptools"}
    if isinstance(app, GatewayApp) and guarded:
        http = uvicorn_protocol_kwargs(connection_limits(app.gateway.config))
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, loop="uvloop", ws="none", **http,
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
    return RunningServer(server, thread, int(server.servers[0].sockets[0].getsockname()[1]))


def stop_servers(running: Sequence[RunningServer]) -> None:
    """Stop servers together: each takes ~0.2 s of uvicorn ticks to wind down."""
    for one in running:
        one.server.should_exit = True
    for one in running:
        one.thread.join(timeout=10)


@contextmanager
def serve_in_thread(app: ASGIApp) -> Iterator[int]:
    """Serve ``app`` with uvicorn on 127.0.0.1; yield its port; stop it cleanly."""
    running = start_server(app)
    try:
        yield running.port
    finally:
        stop_servers([running])


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


def gateway_config(
    engine_ports: Sequence[int],
    body: str,
    *,
    weights: Sequence[float] | None = None,
    engine: str = "emulator",
) -> Config:
    """A config whose single model ``tiny`` has one backend per engine port.

    ``body`` is YAML appended under the model (indented by the caller as
    model keys: ``max_concurrency``, ``lanes``…) followed by top-level keys.
    ``weights`` (one per port) sets the backends' routing weights; ``engine`` their
    engine kind (the profile the gateway reads them with).
    """
    shares = list(weights) if weights is not None else [1.0] * len(engine_ports)
    assert len(shares) == len(engine_ports), (weights, engine_ports)
    backends = "".join(
        f"      - {{name: e{i}, url: 'http://127.0.0.1:{port}', engine: {engine},"
        f" weight: {weight}}}\n"
        for i, (port, weight) in enumerate(zip(engine_ports, shares, strict=True))
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
    weights: Sequence[float] | None = None,
    guarded: bool = True,
    persona: str | None = None,
) -> Iterator[Stack]:
    """``engines`` emulators and a gateway configured with ``body`` in front of them
    (``guarded``: see ``start_server``); ``persona``: the engine the emulators play and
    the gateway reads them as (default: the vLLM personality, ``engine: emulator``)."""
    running: list[RunningServer] = []
    try:
        for i in range(engines):
            emulator = build_emulator(
                engine or preset("tiny"), model=MODEL, seed=i, persona=persona or "vllm"
            )
            running.append(start_server(emulator))
        ports = [one.port for one in running]
        config = gateway_config(ports, body, weights=weights, engine=persona or "emulator")
        env = {"SLUICEGATE_ADMIN_KEY": ADMIN_KEY, **(environ or {})}
        app = build_gateway(config, environ=env, scrape=scrape)
        running.append(start_server(app, guarded=guarded))
        yield Stack(running[-1].port, tuple(ports), config)
    finally:
        stop_servers(running)


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
    """``retry-after-ms`` is an integer ≥ 1 and ``Retry-After`` the same wait in whole
    seconds, rounded up, at least 1."""
    seconds = reply.headers["retry-after"]
    millis = reply.headers["retry-after-ms"]
    assert seconds.isdigit(), seconds
    assert millis.isdigit(), millis
    assert int(seconds) >= 1, seconds
    assert int(millis) >= 1, millis
    assert int(seconds) == max(1, -(-int(millis) // 1000)), (seconds, millis)


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
    prompt: str = "hold",
) -> aiohttp.ClientResponse:
    """Start a streamed ``ignore_eos`` completion and read its first ``events`` data events.

    Once this returns the request is admitted and generating; it holds its slot
    until the caller closes the response (which disconnects) or it finishes.
    """
    all_headers = dict(headers or {})
    if key is not None:
        all_headers["Authorization"] = f"Bearer {key}"
    body = {
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
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
    weights: Sequence[float] | None = None,
) -> Iterator[Stack]:
    """A gateway alone, with backends at ``engine_ports`` (e.g. ones nothing listens on)."""
    config = gateway_config(engine_ports, body, weights=weights)
    env = {"SLUICEGATE_ADMIN_KEY": ADMIN_KEY, **(environ or {})}
    running = start_server(build_gateway(config, environ=env, scrape=scrape))
    try:
        yield Stack(running.port, tuple(engine_ports), config)
    finally:
        stop_servers([running])


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


class EngineServer:
    """One emulated engine on a fixed loopback port that a test can stop, kill and restart.

    The first ``start`` lets the OS choose the port; later starts reuse it, each
    with a fresh emulator (so its counters start again from zero).
    """

    def __init__(self, engine: EngineConfig | None = None, *, seed: int = 0) -> None:
        self._engine = engine or preset("tiny")
        self._seed = seed
        self._running: RunningServer | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def up(self) -> bool:
        return self._running is not None

    def start(self) -> None:
        """Serve a fresh emulator (on the same port as before, if it ran before)."""
        assert self._running is None, "already running"
        app = build_emulator(self._engine, model=MODEL, seed=self._seed)
        self._running = start_server(app, self.port)
        self.port = self._running.port

    def stop(self) -> None:
        """Shut down gracefully (open streams end, the port is released)."""
        running, self._running = self._running, None
        if running is not None:
            stop_servers([running])

    def kill(self) -> None:
        """Die like a crashed process: stop listening and reset every open connection at once,
        then finish shutting down."""
        running = self._running
        assert running is not None, "not running"
        server = running.server

        def abort_all() -> None:
            for listener in server.servers:
                listener.close()
            for connection in list(server.server_state.connections):
                transport = getattr(connection, "transport", None)
                if transport is not None:
                    transport.abort()

        done = threading.Event()

        def run() -> None:
            try:
                abort_all()
            finally:
                done.set()

        server.servers[0].get_loop().call_soon_threadsafe(run)
        assert done.wait(5), "the engine's loop did not run the kill"
        self.stop()

    def stats(self) -> dict[str, float]:
        """The running emulator's ``/emulator/stats``."""
        return engine_stats(self.url)


@contextmanager
def engine_server(engine: EngineConfig | None = None, *, seed: int = 0) -> Iterator[EngineServer]:
    """An :class:`EngineServer`, started; stopped on exit whatever state the test left it in."""
    server = EngineServer(engine, seed=seed)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def read_events(response: aiohttp.ClientResponse) -> list[bytes]:
    """Every SSE ``data:`` payload of a streamed answer, until ``[DONE]`` or the end of the body.

    ``[DONE]`` is included as the last payload when it came.
    """
    payloads: list[bytes] = []
    while True:
        line = await response.content.readline()
        if not line:
            return payloads
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            payloads.append(payload)
            if payload == b"[DONE]":
                return payloads


def text_chunks(payloads: Sequence[bytes]) -> int:
    """How many payloads of a completions stream carry generated text."""
    count = 0
    for payload in payloads:
        if payload == b"[DONE]":
            continue
        event = orjson.loads(payload)
        choices = event.get("choices") or []
        count += bool(choices and choices[0].get("text"))
    return count


def finish_reason(payload: bytes) -> str | None:
    """The ``finish_reason`` of a stream chunk's first choice (None if it has none)."""
    event = orjson.loads(payload)
    choices = event.get("choices") or [{}]
    reason: str | None = choices[0].get("finish_reason")
    return reason


def lane_state(base_url: str, lane: str) -> dict[str, Any]:
    """One lane of the ``tiny`` model in ``/admin/state``."""
    lanes: list[dict[str, Any]] = model_state(base_url)["lanes"]
    return next(entry for entry in lanes if entry["name"] == lane)


def backend_state(base_url: str, backend: str) -> dict[str, Any]:
    """One backend of the ``tiny`` model in ``/admin/state``."""
    backends: list[dict[str, Any]] = model_state(base_url)["backends"]
    return next(entry for entry in backends if entry["name"] == backend)


def metric(base_url: str, name: str, **labels: str) -> float | None:
    """The gateway's sample ``name`` whose labels include ``labels`` (None if absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = http_call(base_url, "GET", "/metrics").body.decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None
