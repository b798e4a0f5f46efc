"""Compare scheduling policies on one workload (and, optionally, across offered loads).

``run_comparison`` is what ``sluicegate simulate`` calls: it measures the
configuration's capacity on the workload once (``sim/capacity.py``), then for
each policy (``config``: the config's own lanes unchanged; any other name: every
lane of the simulated model set to that policy) replays the workload
through ``simulate`` (runs spread over worker processes), prints tables side
by side, and writes ``results.json``, ``requests-<policy>.csv`` and PNG plots
into the output directory.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.queues import Queue
from pathlib import Path
from queue import Empty

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from sluicegate.calibrate.preset_file import load_engine_config
from sluicegate.config import Config
from sluicegate.core.policies import policy_names
from sluicegate.core.spec import SchedulerSpec
from sluicegate.engine.engine_config import EngineConfig
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.capacity import measure_capacity, slot_cap
from sluicegate.sim.plots import plot_latency_cdfs, plot_p99_vs_load, plot_queue_depth
from sluicegate.sim.replica_kv_events import publishes_kv_events
from sluicegate.sim.report import JsonValue, print_report, sweep_table, write_csv, write_json
from sluicegate.sim.result import SimResult
from sluicegate.sim.run_summary import Summary, summarize
from sluicegate.sim.virtual_driver import simulate

ProgressFn = Callable[[float], None]
CONFIG_POLICY = "config"
"""The policy name that runs the configuration's own per-lane policies and fairness."""


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
    """A copy of ``spec`` in which every lane of ``model`` uses ``policy`` as a config
    that names only ``policy`` would: ``fair`` means slack with ``vtc`` fairness, any
    other name that ordering with no fairness.

    Raises:
        ValueError: ``policy`` is not a registered policy.
    """
    known = policy_names()
    if policy not in known:
        raise ValueError(f"unknown policy {policy!r}; choose one of {sorted(known)}")
    models = tuple(
        m.model_copy(
            update={
                "lanes": tuple(
                    lane.model_copy(update={"policy": policy, "fairness": None}) for lane in m.lanes
                )
            }
        )
        if m.name == model
        else m
        for m in spec.models
    )
    return spec.model_copy(update={"models": models})


def policy_spec(spec: SchedulerSpec, model: str, policy: str) -> SchedulerSpec:
    """``spec`` itself for ``config``, else ``with_policy(spec, model, policy)``."""
    return spec if policy == CONFIG_POLICY else with_policy(spec, model, policy)


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
    out_dir: Path,
    model: str | None = None,
    preset: str | None = None,
    replicas: int | None = None,
    seed: int = 0,
    sweep: list[float] | None = None,
    console: Console | None = None,
    workers: int | None = None,
) -> ComparisonResult:
    """Simulate ``workload`` under each policy, print the comparison and write the files.

    Args:
        config: the gateway configuration (models, lanes, tenants, ``simulation``).
        workload: the requests to replay.
        policies: policy names; ``config`` runs the config's own lanes unchanged,
            any other name sets every lane of the model to that policy.
        out_dir: created if missing; receives ``results.json``,
            ``requests-<policy>.csv``, ``latency-cdf-<lane>.png``,
            ``queue-depth.png`` and, with a sweep, ``p99-vs-load.png``.
        model: the model to simulate; default the first configured.
        preset: engine preset; default ``config.simulation.preset``.
        replicas: engine replicas; default ``config.simulation.replicas``.
        seed: engine seed.
        sweep: rate multipliers k: each policy also runs with arrival times / k.
        console: where tables and progress go; ``None`` prints nothing.
        workers: processes to run simulations in parallel; default ``pool_width``
            (about one per CPU); 1 runs them in this process. Results do not
            depend on it. Workers are spawned, so a script that calls this with
            more than one worker must guard its entry point with
            ``if __name__ == "__main__":`` (the CLI's entry point does).

    Raises:
        ValueError: unknown model or policy, no policies, or a bad multiplier.
        KeyError: unknown engine preset.
    """
    _check_policies(policies)
    name = _choose_model(config, model)
    delay = config.simulation.kv_event_delay_s
    if delay and not publishes_kv_events(next(m for m in config.models if m.name == name)):
        raise ValueError(
            f"simulation.kv_event_delay_s is {delay:g} but model {name!r}'s engines publish no "
            "KV events (give a backend kv_events, or use the precise_prefix router)"
        )
    preset_name = preset or config.simulation.preset
    engine = load_engine_config(preset_name)
    count = replicas if replicas is not None else config.simulation.replicas
    multipliers = list(dict.fromkeys(sweep or []))
    scaled = {1.0: workload}
    scaled.update((k, scale_arrivals(workload, k)) for k in multipliers if k != 1.0)
    base = config.scheduler_spec()
    jobs = [
        SimJob(
            policy, k, policy_spec(base, name, policy), name, scaled[k], engine, count, seed,
            config.simulation.scrape_interval_s, delay,
        )
        for policy in policies
        for k in scaled
    ]  # fmt: skip
    cap = slot_cap(base, name, count, engine.max_num_seqs)
    capacity = measure_capacity(
        base, name, workload, engine, count,
        seed=seed, scrape_interval_s=config.simulation.scrape_interval_s, kv_event_delay_s=delay,
    )  # fmt: skip
    rps = capacity.rps if capacity is not None else None
    with _progress_bar(console) as bar:
        runs = dict(zip(((j.policy, j.k) for j in jobs), run_jobs(jobs, workers, bar), strict=True))
    results = {p: runs[p, 1.0] for p in policies}
    summaries = tuple(
        summarize(results[p], label=p, slot_cap=cap, capacity_rps=rps) for p in policies
    )
    swept = tuple(
        summarize(
            runs[p, k], label=f"{p} ×{k:g}", rate_multiplier=k, slot_cap=cap, capacity_rps=rps
        )
        for p in policies
        for k in multipliers
    )
    meta = _meta(name, preset_name, engine, count, seed, len(workload), multipliers)
    meta["capacity"] = (
        None
        if capacity is None
        else {
            "rps": float(f"{capacity.rps:.6g}"),
            "requests": capacity.requests,
            "window_s": float(f"{capacity.window_s:.6g}"),
        }
    )
    meta["slot_cap"] = cap
    return _write(out_dir, results, summaries, swept, meta, console)


def _write(
    out_dir: Path,
    results: Mapping[str, SimResult],
    summaries: tuple[Summary, ...],
    swept: tuple[Summary, ...],
    meta: dict[str, JsonValue],
    console: Console | None,
) -> ComparisonResult:
    """Write the JSON, CSVs and plots, print the tables, and bundle everything up."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = write_json(out_dir / "results.json", summaries, sweep=swept, meta=meta)
    csv_paths = {p: write_csv(out_dir / f"requests-{p}.csv", r) for p, r in results.items()}
    plots = plot_latency_cdfs(results, out_dir)
    plots.append(plot_queue_depth(results, out_dir / "queue-depth.png"))
    if swept:
        series = {
            s.label: [s, *(x for x in swept if x.label.startswith(f"{s.label} ×"))]
            for s in summaries
        }
        plots.append(plot_p99_vs_load(series, out_dir / "p99-vs-load.png"))
    if console is not None:
        print_report(summaries, console)
        if swept:
            console.print(sweep_table(swept))
        console.print(f"wrote {json_path}, {len(csv_paths)} CSV files and {len(plots)} plots")
    return ComparisonResult(summaries, swept, results, json_path, csv_paths, tuple(plots))


def _check_policies(policies: Sequence[str]) -> None:
    if not policies:
        raise ValueError("give at least one policy")
    known = policy_names()
    unknown = [p for p in policies if p not in known and p != CONFIG_POLICY]
    if unknown:
        raise ValueError(
            f"unknown policies {unknown}; choose from {sorted([CONFIG_POLICY, *known])}"
        )


def _meta(
    model: str,
    preset_name: str,
    engine: EngineConfig,
    replicas: int,
    seed: int,
    requests: int,
    multipliers: Sequence[float],
) -> dict[str, JsonValue]:
    """What the JSON records about the setup."""
    engine_fields: dict[str, JsonValue] = dict(dataclasses.asdict(engine))
    return {
        "model": model,
        "preset": preset_name,
        "engine": engine_fields,
        "replicas": replicas,
        "seed": seed,
        "requests": requests,
        "sweep": list(multipliers),
    }


# ---------------------------------------------------------------- running simulations


@dataclass(frozen=True, slots=True)
class SimJob:
    """One simulation of a comparison: ``policy`` at rate multiplier ``k``."""

    policy: str
    k: float
    spec: SchedulerSpec
    model: str
    workload: list[WorkloadRequest]
    engine: EngineConfig
    replicas: int
    seed: int
    scrape_interval_s: float
    kv_event_delay_s: float = 0.0

    @property
    def label(self) -> str:
        """How the run is named in progress bars and tables."""
        return f"{self.policy} ×{self.k:g}"

    def run(self, progress: ProgressFn | None = None) -> SimResult:
        """Simulate."""
        return simulate(
            self.spec, self.model, self.workload, self.engine, self.replicas,
            seed=self.seed, scrape_interval_s=self.scrape_interval_s, progress=progress,
            kv_event_delay_s=self.kv_event_delay_s,
        )  # fmt: skip


def pool_width(jobs: int, cpus: int | None = None) -> int:
    """Workers for ``jobs`` equal runs on ``cpus`` cores (default: this machine's): one per
    run up to the cores, else ⌈jobs / ⌊jobs / cpus⌋⌉, the fewest for ⌊jobs / cpus⌋ rounds
    that all fill the cores (5 runs on 2 cores: 3 workers, 2.5 runs' time, not 3)."""
    cores = cpus if cpus is not None else (os.cpu_count() or 1)
    if jobs <= cores:
        return jobs
    return -(-jobs // (jobs // cores))


def run_jobs(jobs: Sequence[SimJob], workers: int | None, bar: Progress | None) -> list[SimResult]:
    """Run ``jobs``, in parallel processes when ``workers`` (default: CPUs) allows.

    Every run is deterministic and independent of the others, so results are
    the same however many processes run them. Worker processes are spawned
    (not forked) and report progress through a queue.
    """
    count = min(len(jobs), workers if workers is not None else pool_width(len(jobs)))
    trackers = [_tracker(bar, job.label, job.workload) for job in jobs]
    if count <= 1:
        return [job.run(tracker) for job, tracker in zip(jobs, trackers, strict=True)]
    context = multiprocessing.get_context("spawn")
    queue: Queue[tuple[int, float]] = context.Queue()
    with ProcessPoolExecutor(count, context, _init_worker, (queue,)) as pool:
        futures = [pool.submit(_run_in_worker, i, job) for i, job in enumerate(jobs)]
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=0.1)
            _drain(queue, trackers)
        results = [future.result() for future in futures]
    _drain(queue, trackers)
    queue.close()
    queue.join_thread()
    return results


_worker_queue: Queue[tuple[int, float]] | None = None


def _init_worker(queue: Queue[tuple[int, float]]) -> None:
    global _worker_queue
    _worker_queue = queue


def _run_in_worker(index: int, job: SimJob) -> SimResult:
    queue = _worker_queue
    if queue is None:
        return job.run()

    def report(now: float) -> None:
        queue.put((index, now))

    return job.run(report)


def _drain(queue: Queue[tuple[int, float]], trackers: Sequence[ProgressFn | None]) -> None:
    while True:
        try:
            index, now = queue.get_nowait()
        except Empty:
            return
        tracker = trackers[index]
        if tracker is not None:
            tracker(now)
