"""The llama-server presets: llama-server's shape, and step times that reproduce the ones
measured on this machine type by ``sluicegate calibrate``
(``benchmarks/calibrate_llama_server.py --model tiny|small``).

``MEASURED`` holds that script's rows (also in ``docs/BENCHMARKS.md``): per row the step
kind, prompt tokens, batch, tokens out per request and the median step time in
milliseconds that llama-server reported in its per-request ``timings``. The engine model
is driven through the same requests and its steps are compared with the measured ones.
"""

from __future__ import annotations

import statistics

import pytest

from sluicegate.engine import Engine, preset
from tests.engine.engine_harness import Arrival, drive

Row = tuple[str, int, int, int, float]

# The step model is linear in decode sequences; llama.cpp runs 3 sequences about as
# slowly as 4, so batch-3 rows sit up to ~35% above the fit. (The long-context rows stop
# at 2 sequences: 4 prompts of 1,008 tokens overflow one step, see calibrate/probe_plan.)
DECODE_TOLERANCE = 0.40
# A short prompt's prefill carries a fixed ~0.4-0.8 ms the step model lacks: relative to
# the step, or within this many milliseconds.
PREFILL_TOLERANCE, PREFILL_SLACK_MS = 0.25, 0.8

MEASURED: dict[str, list[Row]] = {
    "llama-server-tiny-cpu": [
        ("prefill", 16, 1, 1, 0.476),
        ("prefill", 35, 1, 1, 0.713),
        ("prefill", 78, 1, 1, 0.96),
        ("prefill", 172, 1, 1, 1.676),
        ("prefill", 379, 1, 1, 4.902),
        ("prefill", 836, 1, 1, 17.159),
        ("prefill", 1843, 1, 1, 62.634),
        ("decode", 16, 1, 32, 0.091),
        ("decode", 16, 2, 32, 0.1426),
        ("decode", 16, 3, 32, 0.2854),
        ("decode", 16, 4, 32, 0.2746),
        ("decode", 1008, 1, 32, 0.4008),
        ("decode", 1008, 2, 32, 0.752),
    ],
    "llama-server-small-cpu": [
        ("prefill", 16, 1, 1, 2.134),
        ("prefill", 35, 1, 1, 4.188),
        ("prefill", 78, 1, 1, 7.803),
        ("prefill", 172, 1, 1, 16.508),
        ("prefill", 379, 1, 1, 38.431),
        ("prefill", 836, 1, 1, 105.321),
        ("prefill", 1843, 1, 1, 321.381),
        ("decode", 16, 1, 32, 0.7588),
        ("decode", 16, 2, 32, 0.8344),
        ("decode", 16, 3, 32, 1.5852),
        ("decode", 16, 4, 32, 1.1137),
        ("decode", 1008, 1, 32, 2.0501),
        ("decode", 1008, 2, 32, 4.0664),
    ],
}


def _rows(kind: str) -> list[tuple[str, int, int, int, float]]:
    return [(name, *row[1:]) for name, rows in MEASURED.items() for row in rows if row[0] == kind]


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_preset_has_llama_servers_slots_batch_and_context(name: str) -> None:
    """4 slots (``--parallel 4``), a 2,048-token step (``n_batch``), 8,192 tokens of KV (``-c``)."""
    config = preset(name)
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (4, 2048)
    assert config.kv_capacity_tokens == 8192
    assert config.enable_chunked_prefill
    assert not config.batch_independent


@pytest.mark.parametrize(
    ("name", "prompt", "measured_ms"), [r[:2] + r[4:] for r in _rows("prefill")]
)
def test_prefill_step_matches_measured(name: str, prompt: int, measured_ms: float) -> None:
    """One request's prefill step (which samples its first token) lasts within 25% (or
    0.8 ms) of llama-server's ``prompt_ms`` for that prompt length."""
    trace = drive(Engine(preset(name)), [Arrival(0.0, "r", prompt, 1, ignore_eos=True)])
    first = trace.results()[0]
    assert first.prefill_tokens == prompt
    assert first.finished == ["r"]
    assert first.duration_s * 1000 == pytest.approx(
        measured_ms, rel=PREFILL_TOLERANCE, abs=PREFILL_SLACK_MS
    )


@pytest.mark.parametrize(("name", "prompt", "batch", "output", "measured_ms"), _rows("decode"))
def test_decode_step_matches_measured(
    name: str, prompt: int, batch: int, output: int, measured_ms: float
) -> None:
    """With ``batch`` requests decoding together, the mean pure-decode step lasts within 40%
    of llama-server's ``predicted_per_token_ms`` at that batch size and context."""
    arrivals = [Arrival(0.0, f"r{i}", prompt, output, ignore_eos=True) for i in range(batch)]
    trace = drive(Engine(preset(name)), arrivals)
    steps = [
        r.duration_s for r in trace.results() if r.decode_seqs == batch and not r.prefill_tokens
    ]
    # 4 long prompts exceed one 2,048-token step: the first two start decoding 2 steps early.
    assert len(steps) >= output - 3
    assert statistics.fmean(steps) * 1000 == pytest.approx(measured_ms, rel=DECODE_TOLERANCE)


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_measured_table_covers_every_batch_size(name: str) -> None:
    """The table has prefill rows and decode rows at each batch size 1..4."""
    assert any(row[0] == "prefill" for row in MEASURED[name])
    assert {row[1] for row in MEASURED[name] if row[0] == "decode"} == {16, 1008}
    assert {row[2] for row in MEASURED[name] if row[0] == "decode"} == {1, 2, 3, 4}
