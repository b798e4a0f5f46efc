"""The emulator as llama-server (``--personality llama-server``), over real HTTP on
loopback: its metrics page reads with the llama-server profile, its health answer and
error bodies are llama-server's, and the gateway relays them in OpenAI's shape."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import orjson
import pytest
import uvicorn

from sluicegate.emulator import build_app
from sluicegate.engine import preset
from sluicegate.engine_profiles import PROFILES, scan
from sluicegate.engine_profiles.prometheus_text import Samples
from sluicegate.gateway.request.replies import relayed_error
from tests.engines.conformance import folder

MODEL = "emu-model"
PROFILE = PROFILES["llama-server"]


@contextmanager
def _llama_server_emulator() -> Iterator[str]:
    app = build_app(preset("tiny"), model=MODEL, persona="llama-server")
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive(), "emulator did not start"
        assert time.monotonic() < deadline, "emulator did not start in time"
        time.sleep(0.005)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def base_url() -> Iterator[str]:
    """A llama-server-personality emulator of the ``tiny`` preset."""
    with _llama_server_emulator() as url:
        yield url


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read()


def _post(url: str, body: dict[str, object]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, orjson.dumps(body), {"Content-Type": "application/json"}, method="POST"
    )
    try:
        return _get_response(request)
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def _get_response(request: urllib.request.Request) -> tuple[int, bytes]:
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, response.read()


def _declared(text: str) -> dict[str, str]:
    """``{name: type}`` from a page's ``# TYPE`` lines."""
    return {
        line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE")
    }


def test_the_metrics_page_has_llama_servers_names_and_reads_with_its_profile(
    base_url: str,
) -> None:
    """Every metric the page declares is declared the same way (name, type) on the page
    recorded from llama-server 0.3.36, and after a request the profile reads idle slots
    from it and counts the tokens."""
    status, _ = _post(
        base_url + "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    )
    assert status == 200
    _, page = _get(base_url + "/metrics")
    text = page.decode()
    recorded = _declared((folder("llama-server") / "metrics.prom").read_text())
    declared = _declared(text)
    assert declared
    assert set(declared.items()) <= set(recorded.items())
    reading = PROFILE.read_metrics(scan(text, PROFILE.metric_names))
    assert (reading.running, reading.waiting, reading.kv_usage) == (0, 0, None)
    counts: Samples = scan(text, {"llamacpp:tokens_predicted_total"})
    assert counts.total("llamacpp:tokens_predicted_total") == 3


def test_health_answers_as_llama_server_does(base_url: str) -> None:
    """``/health`` answers 200 with ``{"status": "ok"}``, which the profile reads as up."""
    status, body = _get(base_url + "/health")
    assert (status, orjson.loads(body)) == (200, {"status": "ok"})
    assert PROFILE.healthy(status)


def test_a_too_long_prompt_is_refused_as_llama_server_refuses_it(base_url: str) -> None:
    """The refusal is llama-server's ``exceed_context_size_error`` body, and the gateway
    relays it as OpenAI's 400 ``context_length_exceeded`` with the same message."""
    status, body = _post(
        base_url + "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x" * 4_000_000}]},
    )
    error = orjson.loads(body)["error"]
    assert status == 400
    assert set(error) == {"code", "message", "type"}
    assert (error["code"], error["type"]) == (400, "exceed_context_size_error")
    relayed = relayed_error(PROFILE, status, body)
    assert relayed is not None
    openai = orjson.loads(relayed[1])["error"]
    assert relayed[0] == 400
    assert (openai["code"], openai["message"]) == ("context_length_exceeded", error["message"])


def test_other_refusals_are_invalid_request_errors(base_url: str) -> None:
    """A request for another model is refused in llama-server's shape as an
    ``invalid_request_error`` carrying its status, and relayed with its status."""
    status, body = _post(
        base_url + "/v1/chat/completions",
        {"model": "other", "messages": [{"role": "user", "content": "hi"}]},
    )
    error = orjson.loads(body)["error"]
    assert (error["code"], error["type"]) == (status, "invalid_request_error")
    relayed = relayed_error(PROFILE, status, body)
    assert relayed is not None
    assert relayed[0] == status
    assert orjson.loads(relayed[1])["error"]["message"] == error["message"]
