"""Raw HTTP behaviour: error shapes, health, and the vLLM-named Prometheus metrics."""

from __future__ import annotations

import urllib.error
import urllib.request

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.emulator.emulator_harness import MODEL, LiveEmulator

VLLM_SAMPLES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:num_preemptions_total",
    "vllm:time_to_first_token_seconds_count",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:inter_token_latency_seconds_count",
    "vllm:time_per_output_token_seconds_count",
)


def _post(live: LiveEmulator, path: str, raw: bytes) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        live.base_url + path, data=raw, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, orjson.loads(resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, orjson.loads(err.read())


def _samples(live: LiveEmulator) -> dict[tuple[str, str], float]:
    """Every metric sample, keyed by name and finished_reason label ('' when absent)."""
    with urllib.request.urlopen(live.base_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, s.labels.get("finished_reason", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("model_name") == MODEL
    }


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"prompt": "a", "max_tokens": "5"}', "max_tokens"),
        (b'{"prompt": "a", "max_tokens": 0}', "max_tokens"),
        (b'{"prompt": "a", "stream": "yes"}', "stream"),
        (b'{"prompt": "a", "n": 0}', "n"),
        (b'{"prompt": "a", "n": 129}', "n"),
        (b'{"prompt": 7}', "prompt"),
        (b'{"prompt": ["a", "b"]}', "prompt"),
    ],
)
def test_bad_request_is_400_in_openai_shape(
    emulator: LiveEmulator, raw: bytes, param: str | None
) -> None:
    """Bad JSON or wrong field types give 400 with OpenAI's error object."""
    status, body = _post(emulator, "/v1/completions", raw)
    assert status == 400
    error = body["error"]
    assert isinstance(error, dict)
    assert set(error) == {"message", "type", "code", "param"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_chat_content_parts_are_accepted(emulator: LiveEmulator) -> None:
    """Chat content may be a list of text parts; their text counts toward the prompt."""
    parts = [{"type": "text", "text": "a" * 40}, {"type": "text", "text": "b" * 40}]
    raw = orjson.dumps(
        {"messages": [{"role": "user", "content": parts}], "max_tokens": 3, "ignore_eos": True}
    )
    status, body = _post(emulator, "/v1/chat/completions", raw)
    assert status == 200
    assert body["usage"] == {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23}


def test_health_is_200(emulator: LiveEmulator) -> None:
    """/health answers 200 while the emulator serves."""
    with urllib.request.urlopen(emulator.base_url + "/health", timeout=5) as resp:
        assert resp.status == 200


def test_metrics_have_vllm_names(emulator: LiveEmulator) -> None:
    """/metrics parses as Prometheus text and carries vLLM's metric names for the model."""
    names = {name for name, _ in _samples(emulator)}
    assert set(VLLM_SAMPLES) <= names


def test_metrics_count_a_finished_request(emulator: LiveEmulator) -> None:
    """A completed request adds its tokens to the token counters, one length success,
    one TTFT and one e2e observation, and max_tokens − 1 inter-token gaps."""
    raw = orjson.dumps({"prompt": "a" * 16, "max_tokens": 7, "ignore_eos": True})
    assert _post(emulator, "/v1/completions", raw)[0] == 200
    samples = _samples(emulator)
    assert samples[("vllm:prompt_tokens_total", "")] == 4
    assert samples[("vllm:generation_tokens_total", "")] == 7
    assert samples[("vllm:request_success_total", "length")] == 1
    assert samples[("vllm:request_success_total", "stop")] == 0
    assert samples[("vllm:time_to_first_token_seconds_count", "")] == 1
    assert samples[("vllm:e2e_request_latency_seconds_count", "")] == 1
    assert samples[("vllm:inter_token_latency_seconds_count", "")] == 6
    assert samples[("vllm:num_requests_running", "")] == 0
