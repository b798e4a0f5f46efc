"""``sluicegate calibrate`` end to end: it measures an emulator (a real process) serving a
preset file of known coefficients and overheads, and the preset it writes predicts that
engine's step and solo times.

The emulator runs in real time on a shared machine, so the test compares what the two
presets predict (a step, a request's solo latency), not the coefficients one by one:
several splits of a step's time between base, per-sequence and per-token costs predict
the same times over the probed range.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluicegate.calibrate.preset_file import load_engine_config, write_preset_file
from sluicegate.cli import app
from sluicegate.demo.processes import free_port
from sluicegate.engine import EngineConfig
from tests.distributed.cluster import spawn, stop_children, wait_ready

TRUE = EngineConfig(
    max_num_seqs=4, max_num_batched_tokens=512, kv_capacity_tokens=4096, block_size=16,
    base_s=0.004, per_prefill_token_s=2e-6, per_decode_seq_s=1e-3, per_kv_token_s=2e-7,
    per_prefill_attn_s=1e-9, request_overhead_s=0.003, response_overhead_s=0.002,
)  # fmt: skip
TOLERANCE = 0.15  # steps of a few ms timed through HTTP and asyncio on 2 busy cores
HTTP_S = 0.004  # what the emulator's own HTTP handling adds to a request beyond its preset


@pytest.fixture
def emulated(tmp_path: Path) -> str:
    """``sluicegate emulate --preset FILE`` in a process of its own; its base URL."""
    preset = tmp_path / "true.json"
    write_preset_file(preset, TRUE, {"what": "the engine under test"})
    port = free_port()
    args = ["emulate", "--port", str(port), "--model", "emu", "--preset", str(preset)]
    child = spawn(f"emulate-{port}", args, port, tmp_path, {})
    try:
        wait_ready([(child, "/health")])
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_children([child])


def test_calibrate_recovers_the_emulated_engine(emulated: str, tmp_path: Path) -> None:
    """The written preset keeps the engine's capacity and predicts its decode steps (1 … 4
    sequences, short and long context) within 15%, and its solo latencies (short and long
    prompts) within 15% plus up to 4 ms more for the emulator's own HTTP handling, which
    calibration rightly counts as request overhead; the provenance records the detected
    engine and the probes."""
    out = tmp_path / "fitted.json"
    args = ["calibrate", "--url", emulated, "--model", "emu", "--out", str(out),
            "--repeats", "2", "--slots", "4", "--max-num-batched-tokens", "512"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    fitted = load_engine_config(str(out))
    assert (fitted.max_num_seqs, fitted.max_num_batched_tokens) == (4, 512)
    assert (fitted.kv_capacity_tokens, fitted.block_size) == (4096, 16)
    for batch in (1, 2, 4):
        for context in (16, 900):
            true_s = TRUE.step_s(0, batch, batch * context)
            assert fitted.step_s(0, batch, batch * context) == pytest.approx(
                true_s, rel=TOLERANCE
            ), (batch, context)
    for prompt, output in ((16, 1), (16, 32), (1000, 16), (3600, 1)):
        true_s = TRUE.solo_latency_s(prompt, output)
        error_s = fitted.solo_latency_s(prompt, output) - true_s
        assert -TOLERANCE * true_s <= error_s <= TOLERANCE * true_s + HTTP_S, (prompt, output)
    measured = json.loads(out.read_text())["measured"]
    assert measured["engine"] == "emulator"
    assert {probe["group"] for probe in measured["probes"]} == {"first token", "decode"}
    assert "decode error" in result.output  # the table of the fit's errors is printed


def test_calibrate_refuses_what_it_cannot_know(emulated: str, tmp_path: Path) -> None:
    """Without --slots the emulator's batch is unknown, and an unknown --engine is
    refused: each exits 1 naming the option, writing nothing."""
    out = tmp_path / "never.json"
    base = ["calibrate", "--url", emulated, "--model", "emu", "--out", str(out)]
    missing = CliRunner().invoke(app, [*base, "--max-num-batched-tokens", "512"])
    assert missing.exit_code == 1
    assert "--slots: emulator does not publish" in missing.output
    unknown = CliRunner().invoke(app, [*base, "--engine", "tgi"])
    assert unknown.exit_code == 1
    assert "--engine must be auto or one of" in unknown.output
    assert not out.exists()
