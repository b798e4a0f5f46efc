"""``sluicegate calibrate``: measure a running engine and write its preset file
(``calibration.py`` runs it; this module holds the options, the progress bar and the
tables). ``cli.py`` registers it.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from sluicegate.calibrate.calibration import (
    Calibration,
    CalibrationError,
    CalibrationSettings,
    config_coefficients,
)
from sluicegate.calibrate.engine_client import EngineRequestError
from sluicegate.calibrate.preset_file import write_preset_file

console = Console()
err = Console(stderr=True)


def calibrate(
    url: Annotated[str, typer.Option(help="the engine's base URL")],
    model: Annotated[str, typer.Option(help="model name it serves")],
    out: Annotated[Path, typer.Option(help="preset file to write (JSON)")],
    engine: Annotated[
        str, typer.Option(help="auto (detect), llama-server, vllm or emulator")
    ] = "auto",
    repeats: Annotated[int, typer.Option(help="rounds of every probe")] = 3,
    slots: Annotated[
        int | None, typer.Option(help="sequences it runs at once (default: what it publishes)")
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None,
        typer.Option(help="tokens one step takes (default: llama-server's 2048; else needed)"),
    ] = None,
    context: Annotated[
        int | None,
        typer.Option(help="tokens a request may hold (default: what the engine publishes)"),
    ] = None,
) -> None:
    """Measure a running engine (prefill by prompt length, decode steps by batch size and
    context, fixed per-request overheads), fit the engine model and write a preset file
    that simulate, emulate and simulation.preset accept. Run it on an idle engine with a
    core of its own."""
    import aiohttp

    from sluicegate.calibrate.calibration import calibrate as run_calibration

    try:
        settings = CalibrationSettings(
            url=url, model=model, engine=engine, repeats=repeats, slots=slots,
            max_num_batched_tokens=max_num_batched_tokens, context_tokens=context,
        )  # fmt: skip
        with Progress(console=err, transient=True) as progress:
            task = progress.add_task("probing", total=None)

            def started(total: int) -> None:
                progress.update(task, total=total)

            def advance(count: int) -> None:
                progress.advance(task, count)

            result = asyncio.run(run_calibration(settings, started, advance))
        result.provenance["command"] = shlex.join(["sluicegate", *sys.argv[1:]])
        write_preset_file(out, result.config, result.provenance)
    except (CalibrationError, EngineRequestError, aiohttp.ClientError, OSError) as exc:
        err.print(f"[red]calibrate: {exc}[/red]")
        raise typer.Exit(1) from None
    console.print(probe_table(result))
    console.print(coefficient_table(result))
    console.print(f"wrote {out}")


def probe_table(result: Calibration) -> Table:
    """Measured vs fitted, one row per probe."""
    coefficients = config_coefficients(result.config)
    table = Table(title=f"{result.facts.kind}: measured and fitted (ms)")
    for header in ("probe", "", "n", "measured", "min–max", "fitted", "fitted / measured"):
        table.add_column(header, justify="left" if header in ("probe", "") else "right")
    for sample in result.fit.samples:
        fitted = sample.predicted_s(coefficients)
        low, high = sample.spread_s
        table.add_row(
            sample.group, sample.label, str(sample.count), f"{sample.measured_s * 1e3:.3f}",
            f"{low * 1e3:.3f}–{high * 1e3:.3f}", f"{fitted * 1e3:.3f}",
            f"{fitted / sample.measured_s:.2f}",
        )  # fmt: skip
    return table


def coefficient_table(result: Calibration) -> Table:
    """The fitted coefficients, then each probe group's relative errors."""
    table = Table(title="engine model")
    table.add_column("coefficient / group")
    table.add_column("value", justify="right")
    for name, value in config_coefficients(result.config).items():
        table.add_row(name, f"{value:.4g} s")
    for group in result.fit.groups:
        table.add_row(
            f"{group.group} error",
            f"median {group.median:.1%}, max {group.largest:.1%} ({group.probes} probes)",
        )
    return table
