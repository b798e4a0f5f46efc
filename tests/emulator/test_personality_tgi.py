"""The emulator as TGI (``--personality tgi``), over real HTTP on loopback, read by the
gateway's TGI profile: the two agree on metric names, ``/info`` and the error body."""

from __future__ import annotations

import urllib.error
import urllib.request

import orjson

from sluicegate.engine import preset
from sluicegate.engine_profiles import profile, scan
from sluicegate.gateway.request.replies import relayed_error
from tests.emulator.emulator_harness import MODEL, LiveEmulator, run_emulator

TGI = profile("tgi")


def _get(live: LiveEmulator, path: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(live.base_url + path, timeout=5) as resp:
        return resp.status, resp.read()


def _post(live: LiveEmulator, body: dict[str, object]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        live.base_url + "/v1/chat/completions",
        data=orjson.dumps(body),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def test_tgi_personality_is_read_by_the_tgi_profile() -> None:
    """Health is 200; the metrics page reads (idle, then after one answer) with the KV
    capacity of the engine; ``/info`` gives the same capacity; a prompt past it is TGI's
    422 ``validation`` body, relayed as OpenAI's ``context_length_exceeded``."""
    config = preset("tiny")
    capacity = config.num_blocks * config.block_size
    with run_emulator(config, persona="tgi") as live:
        assert _get(live, TGI.health_path or "")[0] == 200

        _, page = _get(live, TGI.metrics_path or "")
        reading = TGI.read_metrics(scan(page.decode(), TGI.metric_names))
        assert (reading.running, reading.waiting) == (0, 0)
        assert (reading.kv_usage, reading.kv_capacity_tokens) == (0.0, capacity)

        status, answer = _post(
            live, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        )
        assert status == 200, answer
        _, page = _get(live, TGI.metrics_path or "")
        assert b"tgi_request_count 1\n" in page
        assert b"tgi_request_success 1\n" in page

        _, raw = _get(live, TGI.info_path or "")
        info = orjson.loads(raw)
        assert info["model_id"] == MODEL
        assert TGI.read_info(info).kv_capacity_tokens == capacity

        too_long = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": capacity + 1,
        }
        status, body = _post(live, too_long)
        assert status == 422
        native = orjson.loads(body)
        assert set(native) == {"error", "error_type"}
        assert native["error_type"] == "validation"
        relayed = relayed_error(TGI, status, body)
        assert relayed is not None
        error = orjson.loads(relayed[1])["error"]
        assert (relayed[0], error["code"]) == (422, "context_length_exceeded")
        assert error["message"] == native["error"]
