"""``sluicegate plan``: the capacity planner's command (its options, and the tables, KEDA
fragment and plot it writes); the models are ``queueing.py``, ``warm_buffer.py``, ``keda.py``
and ``presentation.py``. ``cli.py`` registers it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

console = Console()
err = Console(stderr=True)


def plan(
    rate: Annotated[float, typer.Option(help="arrival rate, requests per second")],
    slots: Annotated[int, typer.Option(help="concurrent requests one replica serves well")],
    slo_s: Annotated[float, typer.Option(help="p99 queue-wait objective, seconds")],
    service_s: Annotated[
        float | None,
        typer.Option(help="mean service time per request, seconds (or --preset and --workload)"),
    ] = None,
    cv_service: Annotated[
        float | None, typer.Option(help="coefficient of variation of service (default 1)")
    ] = None,
    preset: Annotated[
        str | None,
        typer.Option(help="engine preset name or calibrated file: service from the engine model"),
    ] = None,
    workload: Annotated[
        Path | None, typer.Option(help="trace whose request mix the engine model serves")
    ] = None,
    cv_arrival: Annotated[float, typer.Option(help="coefficient of variation of gaps")] = 1.0,
    max_replicas: Annotated[int, typer.Option(help="give up above this many")] = 1000,
    burst_factor: Annotated[
        float, typer.Option(help="burst to absorb: the rate jumps to K x --rate (K >= 1)")
    ] = 2.0,
    scale_up_s: Annotated[
        float, typer.Option(help="seconds for a new replica to serve: scheduling + model load")
    ] = 90.0,
    detect_s: Annotated[
        float,
        typer.Option(help="seconds from the burst's start until the autoscaler asks for replicas"),
    ] = 60.0,
    model: Annotated[
        str, typer.Option(help="model name the KEDA queries select (the metrics' model label)")
    ] = "MODEL",
    prometheus_url: Annotated[
        str, typer.Option(help="Prometheus base URL for the KEDA triggers' serverAddress")
    ] = "http://prometheus-operated.monitoring.svc:9090",
    trigger_quantile: Annotated[
        float, typer.Option(help="queue-wait quantile of the KEDA trigger (0.95: p95)")
    ] = 0.95,
    scale_to_zero: Annotated[
        bool,
        typer.Option(help="let the model scale to zero when idle (idleReplicaCount: 0)"),
    ] = False,
    out: Annotated[
        Path, typer.Option(help="where to write the PNG and keda-scaledobject.yaml")
    ] = Path("plan-out"),
) -> None:
    """Replicas, queue cap, timeout, warm buffer for a burst, and the KEDA thresholds.

    Erlang C and Allen–Cunneen for the base rate; for the burst, the p99 wait until
    new replicas are ready (detect + scale-up) with only base + warm replicas up.
    """
    from sluicegate.planner.keda import plan_keda, scaled_object_fragment
    from sluicegate.planner.presentation import (
        plot_wait_vs_utilization,
        render_keda,
        render_plan,
        render_warm,
    )
    from sluicegate.planner.queueing import PlanInfeasibleError, PlanInput, plan_capacity
    from sluicegate.planner.warm_buffer import Burst, plan_warm_buffer

    service_s, cv_service = _service(service_s, cv_service, preset, workload, slots)
    try:
        inp = PlanInput(
            arrival_rate=rate,
            mean_service_s=service_s,
            cv_service=cv_service,
            slots_per_replica=slots,
            p99_wait_slo_s=slo_s,
            cv_arrival=cv_arrival,
            max_replicas=max_replicas,
        )
        burst = Burst(factor=burst_factor, scale_up_s=scale_up_s, detect_s=detect_s)
        result = plan_capacity(inp)
        warm = plan_warm_buffer(result, burst)
        keda = plan_keda(
            warm,
            model=model,
            prometheus_url=prometheus_url,
            wait_quantile=trigger_quantile,
            scale_to_zero=scale_to_zero,
        )
    except (PlanInfeasibleError, ValueError) as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    console.print(render_plan(result))
    console.print(render_warm(warm))
    console.print(render_keda(keda))
    fragment = scaled_object_fragment(keda)
    console.print(fragment, end="", markup=False, highlight=False, soft_wrap=True)
    out.mkdir(parents=True, exist_ok=True)
    yaml_path = out / "keda-scaledobject.yaml"
    yaml_path.write_text(fragment, encoding="utf-8")
    png = plot_wait_vs_utilization(result, out / "p99-wait-vs-utilization.png")
    console.print(f"plot: {png}")
    console.print(f"KEDA fragment: {yaml_path}")


def _service(
    service_s: float | None,
    cv_service: float | None,
    preset: str | None,
    workload: Path | None,
    slots: int,
) -> tuple[float, float]:
    """The mean service time and its variability: given, or from the engine model
    (``planner/service_model``) when ``--preset`` and ``--workload`` are; exits 2 when
    neither or both are given."""
    if preset is None and workload is None:
        if service_s is None:
            err.print("[red]give --service-s, or --preset and --workload[/red]")
            raise typer.Exit(2)
        return service_s, 1.0 if cv_service is None else cv_service
    if preset is None or workload is None or service_s is not None or cv_service is not None:
        err.print(
            "[red]--preset and --workload go together, and replace --service-s and "
            "--cv-service (the engine model measures both)[/red]"
        )
        raise typer.Exit(2)
    from sluicegate.calibrate.preset_file import load_engine_config
    from sluicegate.planner.service_model import service_from_model
    from sluicegate.sim.workloads import load_workload

    try:
        estimate = service_from_model(load_engine_config(preset), load_workload(workload), slots)
    except (OSError, KeyError, ValueError) as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    console.print(
        f"engine model ({preset}, {slots} slots, {estimate.requests} requests like "
        f"{workload.name}'s): service {estimate.mean_s:.3f} s mean, cv {estimate.cv:.2f}; "
        f"one replica sustains {estimate.capacity_rps:.2f} req/s"
    )
    return estimate.mean_s, estimate.cv
