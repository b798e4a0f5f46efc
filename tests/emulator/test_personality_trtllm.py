"""The emulator as TensorRT-LLM (``--personality trtllm``), over real HTTP on loopback: its
metrics page reads with the ``trtllm`` engine profile, its health path answers, and a
refused request's body is TensorRT-LLM's, which the gateway relays in OpenAI's shape."""

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
from sluicegate.engine import EngineConfig
from sluicegate.engine_profiles import profile, scan
from sluicegate.gateway.request.replies import relayed_error

MODEL = "emu-model"


@contextmanager
def _trtllm_emulator(config: EngineConfig) -> Iterator[str]:
    """The base URL of an emulator with the ``trtllm`` personality, served by uvicorn."""
    app = build_app(config, model=MODEL, persona="trtllm")
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, name="emulator-trtllm", daemon=True)
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
def base_url(tiny: EngineConfig) -> Iterator[str]:
    """A ``trtllm`` emulator of the ``tiny`` preset."""
    with _trtllm_emulator(tiny) as url:
        yield url


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_the_metrics_page_reads_with_the_trtllm_profile(base_url: str, tiny: EngineConfig) -> None:
    """The profile's metrics path serves ``trtllm_*`` names; an idle engine reads as nothing
    running or waiting, an empty KV cache, and capacity = blocks × tokens per block."""
    engine = profile("trtllm")
    assert engine.metrics_path is not None
    status, body = _get(base_url + engine.metrics_path)
    assert status == 200
    reading = engine.read_metrics(scan(body.decode(), engine.metric_names))
    assert reading.running == 0
    assert reading.waiting == 0
    assert reading.kv_usage == 0.0
    assert reading.kv_capacity_tokens == tiny.num_blocks * tiny.block_size
    assert reading.prefix_hit_rate == 0.0


def test_running_requests_show_on_the_page(base_url: str) -> None:
    """A request in flight reads as running (or waiting) and holds KV blocks."""
    engine = profile("trtllm")
    request = urllib.request.Request(
        base_url + "/v1/completions",
        data=orjson.dumps(
            {
                "model": MODEL,
                "prompt": "x" * 400,
                "max_tokens": 2000,
                "ignore_eos": True,
                "stream": True,
            }
        ),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as stream:
        stream.readline()  # the first event: the request is in the engine
        _, body = _get(base_url + "/prometheus/metrics")
        reading = engine.read_metrics(scan(body.decode(), engine.metric_names))
        assert (reading.running or 0) + (reading.waiting or 0) == 1
        assert reading.kv_usage is not None
        assert reading.kv_usage > 0


def test_health_answers_on_the_profiles_path(base_url: str) -> None:
    """``/health`` answers 200, which the profile reads as up; vLLM's page is not served."""
    engine = profile("trtllm")
    status, _ = _get(base_url + (engine.health_path or "/"))
    assert status == 200
    assert engine.healthy(status)
    assert _get(base_url + "/metrics")[0] == 404


def test_a_refusal_is_trtllms_body_and_relays_in_openais_shape(base_url: str) -> None:
    """An unknown model is refused in TensorRT-LLM's shape (status as ``code``); the
    gateway's relay turns it into OpenAI's, keeping status and message."""
    request = urllib.request.Request(
        base_url + "/v1/completions",
        data=orjson.dumps({"model": "other", "prompt": "hi"}),
        headers={"Content-Type": "application/json"},
    )
    try:
        urllib.request.urlopen(request, timeout=5)
        pytest.fail("the request was not refused")
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    native = orjson.loads(body)
    assert native["object"] == "error"
    assert native["code"] == status
    assert native["type"] == {404: "InvalidRequestError", 400: "BadRequestError"}[status]
    relayed = relayed_error(profile("trtllm"), status, body)
    assert relayed is not None
    assert relayed[0] == status
    error_body = orjson.loads(relayed[1])["error"]
    assert error_body["message"] == native["message"]
    assert isinstance(error_body["code"], str)
    assert set(error_body) >= {"message", "type", "code", "param"}
