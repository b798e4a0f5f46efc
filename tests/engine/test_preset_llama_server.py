"""The ``llama-server-tiny-cpu`` preset: llama-server's shape, and step times that reproduce
the ones measured on this machine type by ``benchmarks/calibrate_llama_server.py``.

``MEASURED`` is that script's table (its ``MEASURED = [...]`` output, also in
``docs/BENCHMARKS.md``): per row the step kind, prompt tokens, batch, tokens out
per request and the median step time in milliseconds that llama-server reported
in its per-request ``timings``. The engine model is driven through the same
requests and its steps are compared with the measured ones.
"""

from __future__ import annotations

import statistics

import pytest

from sluicegate.engine import Engine, preset
from tests.engine.engine_harness import Arrival, drive

NAME = "llama-server-tiny-cpu"
DECODE_TOLERANCE = 0.20
# llama-server's prefill is superlinear in the prompt (attention over it) and the engine
# model's step is linear in prefill tokens: the fit is ~25% slow at 64-128 tokens and
# ~30% fast past 700 (see the preset's comment).
PREFILL_TOLERANCE = 0.40

# (kind, prompt tokens, batch, tokens out, measured step ms)
MEASURED: list[tuple[str, int, int, int, float]] = [
    ("prefill", 64, 1, 1, 2.0285),
    ("prefill", 128, 1, 1, 3.6485),
    ("prefill", 256, 1, 1, 9.4675),
    ("prefill", 512, 1, 1, 24.0395),
    ("prefill", 768, 1, 1, 42.2070),
    ("prefill", 1024, 1, 1, 55.0305),
    ("prefill", 1536, 1, 1, 88.2680),
    ("decode", 32, 1, 128, 0.1755),
    ("decode", 32, 2, 128, 0.3354),
    ("decode", 32, 3, 128, 0.4934),
    ("decode", 32, 4, 128, 0.4729),
    ("decode", 512, 1, 128, 0.4814),
    ("decode", 512, 2, 128, 0.9376),
    ("decode", 512, 3, 128, 1.5028),
    ("decode", 512, 4, 128, 1.7270),
    ("decode", 1024, 1, 128, 0.8890),
    ("decode", 1024, 2, 128, 1.9201),
    ("decode", 1024, 3, 128, 3.1256),
    ("decode", 1024, 4, 128, 3.4113),
]


def test_preset_has_llama_servers_slots_batch_and_context() -> None:
    """4 slots (``--parallel 4``), a 2,048-token step (``n_batch``), 8,192 tokens of KV (``-c``)."""
    config = preset(NAME)
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (4, 2048)
    assert config.kv_capacity_tokens == 8192
    assert config.enable_chunked_prefill
    assert not config.batch_independent


@pytest.mark.parametrize(
    ("prompt", "measured_ms"),
    [(row[1], row[4]) for row in MEASURED if row[0] == "prefill"],
)
def test_prefill_step_matches_measured(prompt: int, measured_ms: float) -> None:
    """One request's prefill step (which samples its first token) lasts within 40% of
    llama-server's ``prompt_ms`` for that prompt length."""
    trace = drive(Engine(preset(NAME)), [Arrival(0.0, "r", prompt, 1, ignore_eos=True)])
    first = trace.results()[0]
    assert first.prefill_tokens == prompt
    assert first.finished == ["r"]
    assert first.duration_s * 1000 == pytest.approx(measured_ms, rel=PREFILL_TOLERANCE)


@pytest.mark.parametrize(
    ("prompt", "batch", "output", "measured_ms"),
    [(row[1], row[2], row[3], row[4]) for row in MEASURED if row[0] == "decode"],
)
def test_decode_step_matches_measured(
    prompt: int, batch: int, output: int, measured_ms: float
) -> None:
    """With ``batch`` requests decoding together, the mean pure-decode step lasts within 20%
    of llama-server's ``predicted_per_token_ms`` at that batch size and context."""
    arrivals = [Arrival(0.0, f"r{i}", prompt, output, ignore_eos=True) for i in range(batch)]
    trace = drive(Engine(preset(NAME)), arrivals)
    steps = [
        r.duration_s for r in trace.results() if r.decode_seqs == batch and not r.prefill_tokens
    ]
    # 4 long prompts exceed one 2,048-token step: the first two start decoding 2 steps early.
    assert len(steps) >= output - 3
    assert statistics.fmean(steps) * 1000 == pytest.approx(measured_ms, rel=DECODE_TOLERANCE)


def test_measured_table_covers_every_batch_size() -> None:
    """The table has prefill rows and decode rows at each batch size 1..4."""
    assert any(row[0] == "prefill" for row in MEASURED)
    assert {row[2] for row in MEASURED if row[0] == "decode"} == {1, 2, 3, 4}
