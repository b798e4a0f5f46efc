"""Compare scheduling policies on one workload (and, optionally, across offered loads).

``run_comparison`` is what ``sluicegate simulate`` calls: for each policy it
sets every lane of the simulated model to that policy, replays the workload
through ``simulate``, prints tables side by side, and writes ``results.json``,
``requests-<policy>.csv`` and PNG plots into the output directory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from sluicegate.config import Config
from sluicegate.core.policies import policy_names
from sluicegate.core.spec import SchedulerSpec
from sluicegate.engine.presets import preset as engine_preset
from sluicegate.sim.driver import simulate
from sluicegate.sim.metrics import SimResult, Summary, summarize
from sluicegate.sim.plots import plot_latency_cdfs, plot_p99_vs_load, plot_queue_depth
from sluicegate.sim.report import JsonValue, print_report, sweep_table, write_csv, write_json
from sluicegate.sim.request import WorkloadRequest

ProgressFn = Callable[[float], None]


@dataclass(frozen=True, slots=True)
class ComparisonResult:
    """What ``run_comparison`` produced.

    Attributes:
        summaries: one per policy, at the workload's own rate, in the order given.
        sweep: one per policy and rate multiplier (empty without a sweep).
        results: policy → its full run at the workload's own rate.
        json_path: the summary JSON.
        csv_paths: policy → its per-request CSV.
        plot_paths: the PNGs written.
    """

    summaries: tuple[Summary, ...]
    sweep: tuple[Summary, ...]
    results: Mapping[str, SimResult]
    json_path: Path
    csv_paths: Mapping[str, Path]
    plot_paths: tuple[Path, ...]


def with_policy(spec: SchedulerSpec, model: str, policy: str) -> SchedulerSpec:
    """A copy of ``spec`` in which every lane of ``model`` uses ``policy``.

    Raises:
        ValueError: ``policy`` is not a registered policy.
    """
    known = policy_names()
    if policy not in known:
        raise ValueError(f"unknown policy {policy!r}; choose one of {sorted(known)}")
    models = tuple(
        m.model_copy(
            update={"lanes": tuple(lane.model_copy(update={"policy": policy}) for lane in m.lanes)}
        )
        if m.name == model
        else m
        for m in spec.models
    )
    return spec.model_copy(update={"models": models})


def scale_arrivals(workload: Sequence[WorkloadRequest], k: float) -> list[WorkloadRequest]:
    """The workload offered ``k`` times as fast: every arrival time divided by ``k``."""
    if not k > 0:
        raise ValueError(f"a rate multiplier must be > 0, got {k}")
    return [dataclasses.replace(w, arrival_s=w.arrival_s / k) for w in workload]


def _choose_model(config: Config, model: str | None) -> str:
    names = [m.name for m in config.models]
    if model is None:
        return names[0]
    if model not in names:
        raise ValueError(f"unknown model {model!r}; configured: {names}")
    return model


@contextmanager
def _progress_bar(console: Console | None) -> Iterator[Progress | None]:
    if console is None:
        yield None
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as bar:
        yield bar


def _tracker(
    bar: Progress | None, label: str, workload: Sequence[WorkloadRequest]
) -> ProgressFn | None:
    """A ``progress`` callback advancing a bar over the workload's virtual time span."""
    if bar is None or not workload:
        return None
    start = min(w.arrival_s for w in workload)
    total = max(max(w.arrival_s for w in workload) - start, 1e-9)
    task = bar.add_task(label, total=total)

    def advance(now: float) -> None:
        bar.update(task, completed=min(total, now - start))

    return advance


def run_comparison(
    config: Config,
    workload: list[WorkloadRequest],
    policies: list[str],
    *,
    model: str | None,
    preset: str | None,
    replicas: int | None,
    out_dir: Path,
    seed: int,
    sweep: list[float] | None,
    console: Console | None,
) -> ComparisonResult:
    """Simulate ``workload`` under each policy, print the comparison and write the files.

    Args:
        config: the gateway configuration (models, lanes, tenants, ``simulation``).
        workload: the requests to replay.
        policies: policy names; each run sets every lane of the model to one of them.
        model: the model to simulate; default the first configured.
        preset: engine preset; default ``config.simulation.preset``.
        replicas: engine replicas; default ``config.simulation.replicas``.
        out_dir: created if missing; receives ``results.json``,
            ``requests-<policy>.csv``, ``latency-cdf-<lane>.png``,
            ``queue-depth.png`` and, with a sweep, ``p99-vs-load.png``.
        seed: engine seed.
        sweep: rate multipliers k: each policy also runs with arrival times / k.
        console: where tables and progress go; ``None`` prints nothing.

    Raises:
        ValueError: unknown model or policy, no policies, or a bad multiplier.
        KeyError: unknown engine preset.
    """
    _check_policies(policies)
    plan = _Plan(
        config=config,
        model=_choose_model(config, model),
        preset=preset or config.simulation.preset,
        replicas=replicas if replicas is not None else config.simulation.replicas,
        seed=seed,
    )
    multipliers = list(sweep or [])
    scaled = {k: scale_arrivals(workload, k) for k in multipliers}
    results: dict[str, SimResult] = {}
    swept: list[Summary] = []
    with _progress_bar(console) as bar:
        for policy in policies:
            results[policy] = plan.simulate(policy, 1.0, workload, bar)
            for k in multipliers:
                run = results[policy] if k == 1.0 else plan.simulate(policy, k, scaled[k], bar)
                swept.append(summarize(run, label=f"{policy} ×{k:g}", rate_multiplier=k))
    summaries = tuple(summarize(results[p], label=p) for p in policies)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = plan.meta(len(workload), multipliers)
    json_path = write_json(out_dir / "results.json", summaries, sweep=swept, meta=meta)
    csv_paths = {p: write_csv(out_dir / f"requests-{p}.csv", results[p]) for p in policies}
    plots = plot_latency_cdfs(results, out_dir)
    plots.append(plot_queue_depth(results, out_dir / "queue-depth.png"))
    if multipliers:
        series = {p: [s, *(x for x in swept if x.label.startswith(f"{p} ×"))] for p, s in
                  zip(policies, summaries, strict=True)}  # fmt: skip
        plots.append(plot_p99_vs_load(series, out_dir / "p99-vs-load.png"))
    if console is not None:
        print_report(summaries, console)
        if swept:
            console.print(sweep_table(swept))
        console.print(f"wrote {json_path}, {len(csv_paths)} CSV files and {len(plots)} plots")
    return ComparisonResult(summaries, tuple(swept), results, json_path, csv_paths, tuple(plots))


def _check_policies(policies: Sequence[str]) -> None:
    if not policies:
        raise ValueError("give at least one policy")
    known = policy_names()
    unknown = [p for p in policies if p not in known]
    if unknown:
        raise ValueError(f"unknown policies {unknown}; choose from {sorted(known)}")


@dataclass(frozen=True, slots=True)
class _Plan:
    """The fixed part of every run of one comparison."""

    config: Config
    model: str
    preset: str
    replicas: int
    seed: int

    def simulate(
        self, policy: str, k: float, workload: list[WorkloadRequest], bar: Progress | None
    ) -> SimResult:
        """One run of ``workload`` with every lane set to ``policy``."""
        spec = with_policy(self.config.scheduler_spec(), self.model, policy)
        return simulate(
            spec, self.model, workload, engine_preset(self.preset), self.replicas,
            seed=self.seed, scrape_interval_s=self.config.simulation.scrape_interval_s,
            progress=_tracker(bar, f"{policy} ×{k:g}", workload),
        )  # fmt: skip

    def meta(self, requests: int, multipliers: Sequence[float]) -> dict[str, JsonValue]:
        """What the JSON records about the setup."""
        engine: dict[str, JsonValue] = dict(dataclasses.asdict(engine_preset(self.preset)))
        return {
            "model": self.model,
            "preset": self.preset,
            "engine": engine,
            "replicas": self.replicas,
            "seed": self.seed,
            "requests": requests,
            "sweep": list(multipliers),
        }
