"""Regenerate the llama-server presets with ``sluicegate calibrate`` on a pinned engine.

Starts ``llama-server`` as the real-engine tests do (``tests/realengine``:
``--parallel 4 -c 8192 --threads 1``) on core 1 alone — this process, and so the
calibration's client, stay on core 0 — serving one of two models, and runs
``sluicegate calibrate`` against it:

* ``tiny``: the tests' GGUF (2 layers, width 64; steps of tens of µs) → preset
  ``llama-server-tiny-cpu``, calibrated against the engine directly;
* ``small``: the fidelity benchmark's shape (4 layers, width 256; steps of ~1 ms) →
  ``llama-server-small-cpu``, calibrated through a gateway in front of the engine, as
  ``benchmarks/fidelity.py`` does, so the relay's cost is in the fixed overheads.

It prints the fit per probe and the ``EngineConfig`` entry for ``engine/presets.py``,
and the measured rows ``tests/engine/test_preset_llama_server.py`` checks the preset
against; ``--write FILE`` puts the table in a section of FILE.

    python benchmarks/calibrate_llama_server.py [--model tiny|small] [--repeats 5]
        [--write docs/BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.realengine.llama_cpp_server import LLAMA_SERVER_VERSION
from tests.realengine.tiny_gguf import Shape, write_tiny_gguf

from fidelity_live import CTX, SHAPE, SLOTS, calibrate, config_text, engines, pin
from livestack import live_stack, wide_console, write_report
from sluicegate.calibrate.preset_file import load_engine_config
from sluicegate.calibrate.probe_plan import DECODE_TOKENS
from sluicegate.engine.engine_config import COEFFICIENTS, EngineConfig

SHAPES: dict[str, tuple[Shape, str]] = {
    "tiny": (Shape(), "llama-server-tiny-cpu"),
    "small": (SHAPE, "llama-server-small-cpu"),
}


def test_rows(probes: list[dict[str, Any]]) -> list[tuple[str, int, int, int, float]]:
    """The prefill and decode probes as ``test_preset_llama_server.MEASURED`` rows: (kind,
    prompt tokens, batch, tokens out, measured step ms). A decode probe's label names its
    mean context, prompt + ``DECODE_TOKENS`` / 2."""
    rows = []
    for p in probes:
        ms = round(p["measured_s"] * 1e3, 4)
        numbers = [int(float(word)) for word in p["probe"].split() if word[0].isdigit()]
        if p["group"] == "prefill":
            rows.append(("prefill", numbers[0], 1, 1, ms))
        elif p["group"] == "decode":
            batch, context = numbers
            rows.append(("decode", context - DECODE_TOKENS // 2, batch, DECODE_TOKENS, ms))
    return rows


def preset_source(name: str, config: EngineConfig) -> str:
    """The ``PRESETS`` entry for ``config``."""
    fields = "".join(f"        {c}={getattr(config, c):.4g},\n" for c in COEFFICIENTS)
    return (
        f'    "{name}": EngineConfig(\n'
        f"        max_num_seqs={config.max_num_seqs},\n"
        f"        max_num_batched_tokens={config.max_num_batched_tokens},\n"
        f"        kv_capacity_tokens={config.kv_capacity_tokens},\n"
        f"        block_size={config.block_size},\n{fields}    ),"
    )


def main(argv: list[str] | None = None) -> int:
    """Start the pinned engine, calibrate, print; optionally write the section."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of every probe")
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args(argv)
    shape, name = SHAPES[args.model]
    out = wide_console()
    pin(os.getpid(), {0})
    with (
        tempfile.TemporaryDirectory(prefix="sluicegate-calibrate-") as tmp_name,
        ExitStack() as stack,
    ):
        tmp = Path(tmp_name)
        gguf = write_tiny_gguf(tmp / f"{args.model}.gguf", shape=shape)
        (server,) = stack.enter_context(engines(gguf, 1, tmp))
        url = server.url
        if args.model == "small":
            live = stack.enter_context(live_stack(out, "sluicegate-calibrate-"))
            url = live.gateway(config_text([server.url], "fifo")).url
        data = calibrate(url, tmp / "preset.json", args.repeats)
        config = load_engine_config(str(tmp / "preset.json"))
    probes = data["measured"]["probes"]
    out.print(preset_source(name, config))
    out.print("MEASURED = [")
    for row in test_rows(probes):
        out.print(f"    {row},")
    out.print("]")
    errors = data["measured"]["errors"]
    notes = [
        f"Engine: `llama-server` (llama-cpp-python {LLAMA_SERVER_VERSION} sdist), model "
        f"`{args.model}` ({shape.layers} layers, width {shape.width}), `--parallel {SLOTS} "
        f"-c {CTX} --threads 1`, pinned to core 1; the client on core 0"
        + (", through a gateway (the relay is in the overheads)" if args.model == "small" else "")
        + ".",
        f"Command run: `{data['measured']['command']}` ({data['measured']['seconds']} s).",
        "Fit errors (|fitted − measured| ÷ measured): "
        + "; ".join(
            f"{g} median {100 * e['median']:.1f}%, max {100 * e['max']:.1f}%"
            for g, e in errors.items()
        )
        + f". Preset `{name}`: "
        + ", ".join(f"{c} {getattr(config, c):.3g}" for c in COEFFICIENTS)
        + ".",
    ]
    rows = [
        [p["group"], p["probe"], f"{p['measured_s'] * 1e3:.3f}", f"{p['fitted_s'] * 1e3:.3f}",
         f"{p['fitted_s'] / p['measured_s']:.2f}"]
        for p in probes
    ]  # fmt: skip
    grid = (
        f"{name}: measured vs fitted (ms)",
        ["group", "probe", "measured", "fitted", "ratio"],
        rows,
    )
    write_report(
        args, script="calibrate_llama_server.py", section=f"calibrate_llama_server_{args.model}",
        title=f"Calibration: llama-server on this machine (preset `{name}`)",
        notes=notes, grids=[grid], argv=argv, out=out,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
