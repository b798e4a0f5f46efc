"""The emulator as SGLang, over real HTTP on loopback, read by the gateway's SGLang
profile: its metrics page, its server-info documents and its error body."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import orjson
import uvicorn

from sluicegate.emulator import build_app
from sluicegate.engine import preset
from sluicegate.engine_profiles import profile, scan
from sluicegate.gateway.request.replies import relayed_error

MODEL = "emu-model"


@contextmanager
def _sglang_emulator() -> Iterator[str]:
    """An emulator of the ``tiny`` preset playing SGLang; yields its base URL."""
    app = build_app(preset("tiny"), model=MODEL, seed=0, persona="sglang")
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive(), "emulator died while starting"
        assert time.monotonic() < deadline, "emulator did not start in 10 s"
        time.sleep(0.005)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return answer.status, answer.read()


def test_profile_reads_the_sglang_personality() -> None:
    """Health is up, the metrics page reads idle with the preset's KV capacity, both
    server-info paths give the same capacity, and a refused request's flat error body
    reaches the client in OpenAI's shape with SGLang's message."""
    sglang = profile("sglang")
    config = preset("tiny")
    capacity = config.num_blocks * config.block_size
    with _sglang_emulator() as base:
        assert sglang.health_path is not None
        assert sglang.metrics_path is not None
        status, _ = _get(base + sglang.health_path)
        assert sglang.healthy(status)
        _, page = _get(base + sglang.metrics_path)
        reading = sglang.read_metrics(scan(page.decode(), sglang.metric_names))
        assert (reading.running, reading.waiting, reading.kv_usage) == (0, 0, 0.0)
        assert reading.kv_capacity_tokens == capacity
        assert reading.prefix_hit_rate == 0.0  # no prompt yet: the gauge, 0
        for path in ("/get_server_info", "/server_info"):
            _, document = _get(base + path)
            assert sglang.read_info(orjson.loads(document)).kv_capacity_tokens == capacity
        request = urllib.request.Request(
            base + "/v1/chat/completions",
            data=orjson.dumps({"model": "no-such-model", "messages": []}),
            headers={"content-type": "application/json"},
        )
        try:
            urllib.request.urlopen(request, timeout=5)
            raise AssertionError("a request for an unknown model was served")
        except urllib.error.HTTPError as refused:
            status, body = refused.code, refused.read()
    native = orjson.loads(body)
    assert set(native) == {"object", "message", "type", "param", "code"}
    assert (native["object"], native["code"]) == ("error", status)
    relayed = relayed_error(sglang, status, body)
    assert relayed is not None
    error = orjson.loads(relayed[1])["error"]
    assert relayed[0] == status
    assert error["message"] == native["message"]
    assert set(error) >= {"message", "type", "code", "param"}
    assert isinstance(error["code"], str)
