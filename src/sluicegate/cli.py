"""The ``sluicegate`` command."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from sluicegate.calibrate.calibrate_command import calibrate
from sluicegate.clients.batch_command import batch_app
from sluicegate.config import ConfigError, load_config, redacted_store
from sluicegate.planner.plan_command import plan
from sluicegate.store.store_errors import StoreUnavailableError

app = typer.Typer(
    help="Admission control and scheduling gateway for OpenAI-compatible LLM engines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(batch_app, name="batch")
console = Console()
err = Console(stderr=True)

# The options ``simulate`` and ``bench`` share: where the workload comes from and how it
# is reshaped (sim/workload_options.py reads them).
TraceOption = Annotated[Path | None, typer.Option(help="Azure/BurstGPT CSV or JSONL")]
PoissonOption = Annotated[float | None, typer.Option("--poisson", help="req/s")]
GammaOption = Annotated[str | None, typer.Option(help="bursty arrivals RATE:CV")]
DurationOption = Annotated[float, typer.Option(help="seconds of synthetic load")]
WindowOption = Annotated[str | None, typer.Option(help="START:DURATION seconds of the trace")]
RateScaleOption = Annotated[float, typer.Option(help="replay at k× the rate")]
MaxTokensOption = Annotated[
    str, typer.Option(help="traces: client max_tokens = exact | pow2 | N (a fixed cap)")
]
FieldOption = Annotated[
    list[str] | None,
    typer.Option(help="trace column NAME=COLUMN[:UNIT], prefix=COLUMN[:BLOCK_TOKENS] (repeat)"),
]
MixOption = Annotated[str | None, typer.Option(help="share:tenant:lane:priority[:deadline_ms],...")]


@app.command("check-config")
def check_config(
    path: Annotated[Path, typer.Argument(help="YAML configuration file")],
    connect: Annotated[
        bool, typer.Option("--connect", help="also check the shared store answers (redis://)")
    ] = False,
) -> None:
    """Validate a configuration file; exit 1 with every bad field and its line."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    for model in config.models:
        lanes = ", ".join(f"{lane.name} ({lane.policy})" for lane in model.lanes)
        console.print(
            f"model [bold]{model.name}[/bold]: {len(model.backends)} backend(s), "
            f"router {model.router}, lanes {lanes}"
        )
    console.print(f"{len(config.tenants)} tenant(s); store {redacted_store(config.store)}")
    if connect:
        if not config.shared_store:
            console.print("--connect: the memory store lives in the gateway; nothing to reach")
        else:
            from sluicegate.store.check import check_store
            from sluicegate.store.redis_store import RedisStore

            settings = config.distributed
            store = RedisStore(
                config.store,
                prefix=settings.key_prefix,
                replica="check-config",
                lease_ttl_s=settings.lease_ttl_s,
                timeout_s=settings.timeout_ms / 1000.0,
                cluster=settings.cluster,
            )
            try:
                round_trip_s = asyncio.run(check_store(store))
            except StoreUnavailableError as exc:
                err.print(f"[red]store: unreachable: {exc}[/red]")
                raise typer.Exit(1) from None
            console.print(f"store reachable: round trip {round_trip_s * 1000:.2f} ms")
    console.print("[green]configuration is valid[/green]")


@app.command()
def serve(
    config: Annotated[Path, typer.Option("--config", "-c", help="YAML configuration file")],
    host: Annotated[str | None, typer.Option(help="override server.host")] = None,
    port: Annotated[int | None, typer.Option(help="override server.port")] = None,
    workers: Annotated[
        int,
        typer.Option(
            help="processes serving one port as one gateway (> 1: they share limits "
            "through the config's store, or a private redis-server)"
        ),
    ] = 1,
) -> None:
    """Run the gateway."""
    if workers < 1:
        err.print(f"[red]--workers: must be at least 1, got {workers}[/red]")
        raise typer.Exit(2)
    try:
        loaded = load_config(config)
        from sluicegate.gateway.app import check_servable

        check_servable(loaded)
        if workers == 1:
            from sluicegate.gateway.app import serve as run_gateway

            run_gateway(loaded, host=host, port=port)
            return
        from sluicegate.gateway.workers.supervisor import WorkersError, run_workers

        try:
            code = run_workers(config, loaded, workers, host, port)
        except WorkersError as exc:
            err.print(f"[red]serve --workers {workers}: {exc}[/red]")
            raise typer.Exit(1) from None
        raise typer.Exit(code)
    except ConfigError as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None


@app.command()
def drain(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="the gateway's YAML: its port and admin_key_env"),
    ] = None,
    url: Annotated[
        str | None, typer.Option(help="gateway base URL (default http://127.0.0.1:<port>)")
    ] = None,
    admin_key_env: Annotated[
        str | None,
        typer.Option(
            help="variable holding the admin key (default: the config's, else SLUICEGATE_ADMIN_KEY)"
        ),
    ] = None,
    wait_s: Annotated[float, typer.Option(help="wait at most this long for it to go idle")] = 25.0,
    cancel: Annotated[bool, typer.Option("--cancel", help="undo a drain: admit again")] = False,
) -> None:
    """Stop a running gateway admitting and wait until nothing is queued or running
    (a Kubernetes preStop hook). Exits 0 once idle, 3 if still busy after --wait-s.
    With --cancel, undo a drain instead (exit 0 once every worker admits again)."""
    from sluicegate.clients.drain import DrainError, undrain
    from sluicegate.clients.drain import drain as drain_gateway

    try:
        loaded = load_config(config) if config is not None else None
    except ConfigError as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    env_name = admin_key_env or (loaded and loaded.server.admin_key_env) or "SLUICEGATE_ADMIN_KEY"
    key = os.environ.get(env_name)
    if not key:
        err.print(f"[red]drain: the admin key variable {env_name} is not set[/red]")
        raise typer.Exit(1)
    port = loaded.server.port if loaded is not None else 8080
    try:
        if cancel:
            if not undrain(url or f"http://127.0.0.1:{port}", key):
                err.print("[red]drain --cancel: a worker did not answer; it may still drain[/red]")
                raise typer.Exit(3)
            console.print("undrained: admitting again")
            return
        result = drain_gateway(url or f"http://127.0.0.1:{port}", key, wait_s=wait_s)
    except DrainError as exc:
        err.print(f"[red]drain: {exc}[/red]")
        raise typer.Exit(1) from None
    if result.idle:
        console.print(f"drained: idle after {result.waited_s:.1f} s")
        return
    console.print(
        f"still busy after {result.waited_s:.1f} s: {result.queued} queued,"
        f" {result.running} running"
    )
    raise typer.Exit(3)


@app.command()
def emulate(
    port: Annotated[int, typer.Option(help="TCP port to listen on")] = 8000,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    preset: Annotated[str, typer.Option(help="engine preset name or preset file")] = "tiny",
    model: Annotated[str, typer.Option(help="model name it serves")] = "emulated",
    max_num_seqs: Annotated[int | None, typer.Option(help="override the preset's batch")] = None,
    seed: Annotated[int, typer.Option(help="seed of output lengths and text")] = 0,
    personality: Annotated[
        str, typer.Option(help="the engine it looks like: vllm, sglang, tgi, trtllm, llama-server")
    ] = "vllm",
    scheduling_policy: Annotated[
        str, typer.Option(help="vLLM's: fcfs, or priority (the request's priority, lower first)")
    ] = "fcfs",
    no_prefix_caching: Annotated[
        bool,
        typer.Option(
            "--no-prefix-caching",
            help="vLLM's --no-enable-prefix-caching: prefill every prompt whole",
        ),
    ] = False,
    kv_events: Annotated[
        str | None, typer.Option(help="publish KV cache events (vLLM's) on a ZMQ PUB tcp://…")
    ] = None,
    kv_events_replay: Annotated[
        str | None, typer.Option(help="ZMQ ROUTER tcp://… answering replays of missed batches")
    ] = None,
    kv_events_topic: Annotated[str, typer.Option(help="topic frame of each event message")] = "",
) -> None:
    """Serve an emulated continuous-batching engine over the OpenAI API, with the metric
    names, endpoints and error shapes of the engine ``--personality`` names."""
    from sluicegate.emulator import serve as run_emulator
    from sluicegate.emulator.kv_event_publisher import KvEventsOptions

    try:
        if kv_events is None and (kv_events_replay is not None or kv_events_topic):
            raise ValueError("--kv-events-replay and --kv-events-topic need --kv-events")
        publishing = None
        if kv_events is not None:
            publishing = KvEventsOptions(kv_events, kv_events_replay, kv_events_topic)
        run_emulator(
            host, port, preset=preset, model=model, max_num_seqs=max_num_seqs, seed=seed,
            persona=personality, scheduling_policy=scheduling_policy,
            prefix_caching=not no_prefix_caching, kv_events=publishing,
        )  # fmt: skip
    except (KeyError, ValueError) as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None


@app.command(hidden=True)
def passthrough(
    backend: Annotated[list[str], typer.Option(help="engine base URL (repeatable)")],
    port: Annotated[int, typer.Option(help="TCP port to listen on")] = 8090,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
) -> None:
    """A plain round-robin pass-through proxy (the demo's and benchmarks' baseline)."""
    from sluicegate.demo.passthrough import serve_passthrough

    serve_passthrough(backend, host, port)


@app.command()
def demo(
    duration: Annotated[float, typer.Option(help="seconds of load per phase")] = 25.0,
    out: Annotated[Path, typer.Option(help="where to write CSVs and the plot")] = Path("demo-out"),
    seed: Annotated[int, typer.Option(help="workload seed")] = 7,
) -> None:
    """Pass-through vs sluicegate under the same overload, on emulated engines."""
    from sluicegate.demo.side_by_side import DemoSettings, run_demo

    run_demo(DemoSettings(duration_s=duration, out_dir=out, seed=seed), console)


@app.command()
def simulate(
    config: Annotated[Path | None, typer.Option(help="gateway YAML (with `simulation:`)")] = None,
    trace: TraceOption = None,
    poisson_rate: PoissonOption = None,
    gamma: GammaOption = None,
    duration: DurationOption = 600.0,
    window: WindowOption = None,
    rate_scale: RateScaleOption = 1.0,
    max_tokens: MaxTokensOption = "exact",
    field: FieldOption = None,
    prefix_workload: Annotated[
        str | None, typer.Option(help="shared system prompts RATE:PROMPTS:BLOCKS[:ZIPF]")
    ] = None,
    b2b_workload: Annotated[
        str | None,
        typer.Option(
            help="customers' long contexts and short questions "
            "RATE:CUSTOMERS:CONTEXT_TOKENS[:ZIPF[:BURST]]"
        ),
    ] = None,
    tenant_load: Annotated[
        list[str] | None,
        typer.Option(help="TENANT:RATE[:burst=KxDs/Ps][:lane=NAME][:priority=N] (repeat)"),
    ] = None,
    mix: MixOption = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(help="policy to compare (repeat); config (default): the config's own lanes"),
    ] = None,
    preset: Annotated[str | None, typer.Option(help="engine preset name or preset file")] = None,
    replicas: Annotated[int | None, typer.Option(help="engine replicas")] = None,
    sweep: Annotated[str | None, typer.Option(help="rate multipliers, e.g. 0.5,1,1.5,2")] = None,
    out: Annotated[Path, typer.Option(help="output directory")] = Path("sim-out"),
    seed: Annotated[int, typer.Option(help="seed of workload and engines")] = 0,
    workers: Annotated[int | None, typer.Option(help="parallel processes")] = None,
) -> None:
    """Replay a trace or synthetic load through the real scheduler under a virtual clock."""
    from sluicegate.sim.comparison import run_comparison
    from sluicegate.sim.workload_options import (
        DEFAULT_POLICIES,
        build_workload,
        default_config,
        workload_options,
    )

    try:
        loaded = load_config(config, simulation=True) if config is not None else default_config()
        if loaded.pressure is not None:
            err.print("note: simulate ignores pressure: (serve polls it from Prometheus)")
        options = workload_options(
            trace=trace, poisson_rate=poisson_rate, gamma=gamma, duration_s=duration,
            window=window, rate_scale=rate_scale, mix=mix, seed=seed, max_tokens=max_tokens,
            fields=tuple(field or ()), prefix_workload=prefix_workload,
            tenant_load=tuple(tenant_load or ()), b2b_workload=b2b_workload,
        )  # fmt: skip
        requests = build_workload(options)
        multipliers = [float(k) for k in sweep.split(",")] if sweep else None
        run_comparison(
            loaded,
            requests,
            list(policy or DEFAULT_POLICIES),
            out_dir=out,
            preset=preset,
            replicas=replicas,
            seed=seed,
            sweep=multipliers,
            console=console,
            workers=workers,
        )
    except (ConfigError, ValueError, KeyError, OSError) as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None


@app.command()
def bench(
    url: Annotated[str, typer.Option(help="base URL of the server (gateway or engine)")],
    model: Annotated[str, typer.Option(help="model name to request")],
    trace: TraceOption = None,
    poisson_rate: PoissonOption = None,
    gamma: GammaOption = None,
    duration: DurationOption = 60.0,
    window: WindowOption = None,
    rate_scale: RateScaleOption = 1.0,
    max_tokens: MaxTokensOption = "exact",
    field: FieldOption = None,
    mix: MixOption = None,
    key: Annotated[list[str] | None, typer.Option(help="TENANT=API_KEY (repeat)")] = None,
    slo: Annotated[list[str] | None, typer.Option(help="LANE=MS end-to-end SLO")] = None,
    stream: Annotated[bool, typer.Option(help="streaming requests")] = True,
    ignore_eos: Annotated[bool, typer.Option(help="generate exactly max_tokens")] = True,
    timeout: Annotated[float, typer.Option(help="per-request timeout, s")] = 120.0,
    out: Annotated[Path | None, typer.Option(help="per-request CSV")] = None,
    compare_to: Annotated[Path | None, typer.Option("--compare", help="baseline CSV")] = None,
    seed: Annotated[int, typer.Option(help="workload seed")] = 0,
) -> None:
    """Open-loop load: arrivals on a schedule, independent of responses."""
    from sluicegate.bench.bench_command import BenchOptions, parse_assignments, run_bench
    from sluicegate.sim.workload_options import build_workload, workload_options

    try:
        if any(f.split("=", 1)[0].strip() == "prefix" for f in field or ()):
            raise ValueError(
                "--field prefix=...: bench sends synthetic prompt text, so block hashes would"
                " change nothing; map prefix only for simulate"
            )
        options_in = workload_options(
            trace=trace, poisson_rate=poisson_rate, gamma=gamma, duration_s=duration,
            window=window, rate_scale=rate_scale, mix=mix, seed=seed, max_tokens=max_tokens,
            fields=tuple(field or ()),
        )  # fmt: skip
        schedule = build_workload(options_in)
        options = BenchOptions(
            url=url,
            model=model,
            keys=parse_assignments(key or [], "--key"),
            stream=stream,
            ignore_eos=ignore_eos,
            timeout_s=timeout,
            slo_ms={k: float(v) for k, v in parse_assignments(slo or [], "--slo").items()},
            out=out,
            compare_to=compare_to,
        )
    except (ValueError, OSError) as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    raise typer.Exit(run_bench(schedule, options, console))


app.command()(plan)
app.command()(calibrate)


def main() -> None:
    """Entry point for ``python -m sluicegate``."""
    app()
