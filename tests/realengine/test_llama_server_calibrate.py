"""``sluicegate calibrate`` against llama.cpp's own ``llama-server`` on the tests' tiny GGUF:
it detects the engine, reads its slots and context from ``/props``, uses its server-side
``timings``, and writes a preset that predicts a short request's latency within 2×.

Skips, saying why, when the llama-server binary has not been built (``make llama-server``)."""

from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from sluicegate.calibrate.preset_file import load_engine_config
from sluicegate.cli import app
from tests.realengine.llama_cpp_server import LLAMA_SERVER_VERSION, llama_cpp_server

pytestmark = pytest.mark.realengine


def built_binary() -> Path:
    """The llama-server binary the harness would use; skip the test when it is missing."""
    configured = os.environ.get("SLUICEGATE_LLAMA_SERVER")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    default = cache / "sluicegate" / f"llama-server-{LLAMA_SERVER_VERSION}" / "llama-server"
    binary = Path(configured) if configured else default
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        pytest.skip(f"no llama-server binary at {binary} (make llama-server)")
    pytest.importorskip("gguf", reason="writing the tiny GGUF needs the engine-tests extras")
    return binary


def short_request_s(url: str) -> float:
    """Client time of one uncached request of 16 token ids and 8 tokens out."""
    body = {"model": "tiny", "prompt": list(range(40, 56)), "max_tokens": 8,
            "ignore_eos": True, "cache_prompt": False, "temperature": 0.0}  # fmt: skip
    request = urllib.request.Request(
        url + "/v1/completions", orjson.dumps(body), {"Content-Type": "application/json"}
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
    return time.perf_counter() - started


def test_calibrate_llama_server(tmp_path: Path) -> None:
    """The preset has llama-server's slots (4) and KV (-c 8192) and its server-side prefill
    probes; its solo latency for a short request is within 2× of the measured one."""
    built_binary()
    from tests.realengine.tiny_gguf import write_tiny_gguf

    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "llama-server.json"
    with llama_cpp_server(model, parallel=4, ctx=8192, log=tmp_path / "server.log") as server:
        args = ["calibrate", "--url", server.url, "--model", "tiny", "--engine", "llama-server",
                "--out", str(out), "--repeats", "2"]  # fmt: skip
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        measured = sorted(short_request_s(server.url) for _ in range(5))[2]
    fitted = load_engine_config(str(out))
    assert (fitted.max_num_seqs, fitted.kv_capacity_tokens) == (4, 8192)
    predicted = fitted.solo_latency_s(16, 8)
    assert measured / 2 <= predicted <= measured * 2, (predicted, measured)
    groups = {probe["group"] for probe in orjson.loads(out.read_bytes())["measured"]["probes"]}
    assert groups == {"prefill", "first token", "decode"}
