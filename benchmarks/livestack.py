"""What the live benchmarks share: emulators and a gateway as child processes, what each
costs the machine (/proc), the gateway's gauges, and the Markdown section around the tables.

``bench_overload``, ``bench_policies`` and ``bench_scale`` start their processes
through ``LiveStack`` (``python -m sluicegate emulate|serve`` on free loopback
ports, stopped on exit, logs printed if one fails to start). Their tables are
``tables.Grid``s, which ``write_report`` prints and writes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import math
import os
import platform
import resource
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from mdsection import write_section
from sluicegate.demo.processes import Children, children, free_port
from tables import Grid, markdown, render

__all__ = [
    "CpuMeter",
    "LiveStack",
    "Process",
    "apply_presets",
    "gauge",
    "live_stack",
    "machine_busy_s",
    "raise_open_files",
    "wide_console",
    "write_report",
]


@dataclass(frozen=True, slots=True)
class Process:
    """One child process: its role, base URL and pid."""

    name: str
    url: str
    pid: int

    def cpu_s(self) -> float:
        """CPU seconds (user + system) it has used so far; NaN once it is gone."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return math.nan
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_bytes(self) -> int:
        """Its resident set size now (``VmRSS``); 0 once it is gone."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return 0
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (all but idle and iowait), every process."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return math.nan
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU that everything else on the machine used while we measured: a noisy neighbour
    (another user's build, a test run) makes every latency worse."""

    def __init__(self, processes: Sequence[Process]) -> None:
        self._processes = list(processes)
        self._start = self._read()

    def _read(self) -> tuple[float, float, float]:
        ours = time.process_time() + sum(p.cpu_s() for p in self._processes)
        return time.monotonic(), machine_busy_s(), ours

    def others_cores(self) -> float:
        """Cores kept busy, on average since construction, by processes that are not ours."""
        now, machine, ours = self._read()
        then, machine0, ours0 = self._start
        return max(0.0, (machine - machine0) - (ours - ours0)) / max(now - then, 1e-9)


class LiveStack:
    """Emulated engines and gateways started as ``python -m sluicegate`` children.

    Each process listens on a free loopback port and is waited for until it
    answers; all of them stop when the ``live_stack`` context ends.
    """

    def __init__(self, group: Children, log_dir: Path) -> None:
        self._group = group
        self.log_dir = log_dir
        self._count = 0

    def engine(
        self,
        model: str,
        preset: str,
        *,
        max_num_seqs: int | None = None,
        scheduling_policy: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> Process:
        """Start ``sluicegate emulate`` serving ``model`` with the engine ``preset`` (and
        ``--max-num-seqs``, ``--scheduling-policy`` when given, then ``extra_args``)."""
        port = free_port()
        args = ["emulate", "--port", str(port), "--preset", preset, "--model", model]
        if max_num_seqs is not None:
            args += ["--max-num-seqs", str(max_num_seqs)]
        if scheduling_policy is not None:
            args += ["--scheduling-policy", scheduling_policy]
        args += extra_args
        return self._start(f"engine-{model}", args, port, "/health")

    def gateway(
        self,
        config: str,
        env: Mapping[str, str] | None = None,
        *,
        server: Mapping[str, float] | None = None,
    ) -> Process:
        """Start ``sluicegate serve`` on ``config``, YAML without ``server:``.

        The server section is added: a free loopback port, no admin key, engines
        scraped every second, and ``server`` settings on top. ``env`` (API keys
        the config's tenants name) is added to this process's environment, which
        the child inherits.
        """
        port = free_port()
        self._count += 1
        path = self.log_dir / f"gateway-{self._count}.yaml"
        settings = {"scrape_interval_s": 1.0, **(server or {})}
        extra = "".join(f", {key}: {value:g}" for key, value in settings.items())
        path.write_text(
            f"server: {{host: 127.0.0.1, port: {port}, admin_key_env: null{extra}}}\n" + config
        )
        os.environ.update(env or {})
        return self._start("sluicegate", ["serve", "--config", str(path)], port, "/readyz")

    def _start(self, name: str, args: list[str], port: int, ready: str) -> Process:
        url = f"http://127.0.0.1:{port}"
        return Process(name, url, self._group.start(f"{name}-{port}", args, url + ready))

    def stop(self, process: Process | None = None) -> None:
        """Stop ``process`` (SIGTERM, then SIGKILL after 5 s), or every process started so far.

        A process stopped alone is reaped when the stack ends.
        """
        if process is None:
            self._group.stop()
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + 5.0
            while _alive(process.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(process.pid):
                os.killpg(process.pid, signal.SIGKILL)

    def dump_logs(self, console: Console) -> None:
        """Print the tail of every child's log (after a failed start)."""
        for log in sorted(self.log_dir.glob("*.log")):
            console.print(f"[red]{log.name}[/red]\n{log.read_text()[-2000:]}")


@contextlib.contextmanager
def live_stack(console: Console, prefix: str) -> Iterator[LiveStack]:
    """A ``LiveStack`` in a temporary log directory; its logs are printed if anything fails."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp, children(Path(tmp)) as group:
        stack = LiveStack(group, Path(tmp))
        try:
            yield stack
        except BaseException:
            stack.dump_logs(console)
            raise


async def gauge(session: aiohttp.ClientSession, base_url: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` on ``base_url``/metrics that carry ``labels``."""
    async with session.get(base_url + "/metrics") as response:
        text = await response.text()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += float(sample.value)
    return total


def raise_open_files(wanted: int) -> int:
    """Raise this process's open-file limit towards ``wanted`` (children inherit it).

    Returns the soft limit now in force, which may be lower than ``wanted`` when
    the hard limit is.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def apply_presets(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    presets: Sequence[Mapping[str, object]],
) -> argparse.Namespace:
    """Each preset's settings (``--quick``, ``--smoke``...) over ``args``, in order, except
    where the command line gave a value other than the default."""
    for preset in presets:
        for name, value in preset.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    return args


def wide_console() -> Console:
    """A console that does not wrap tables when output goes to a file or pipe."""
    return Console(width=None if sys.stdout.isatty() else 220)


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """How the benchmark was invoked, for the report."""
    args = sys.argv[1:] if argv is None else list(argv)
    return shlex.join(["python", f"benchmarks/{script}", *args])


def write_report(
    args: argparse.Namespace,
    *,
    script: str,
    section: str,
    title: str,
    notes: Sequence[str],
    grids: Sequence[Grid],
    argv: Sequence[str] | None,
    out: Console,
) -> None:
    """Print every grid; with ``--write FILE`` put the section (title, command, machine,
    date, ``notes``, tables) between its markers in FILE."""
    for grid in grids:
        render(out, grid)
    if args.write is None:
        return
    lines = [
        f"## {title}",
        "",
        f"Command: `{command_line(script, argv)}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {sys.platform}  ",
        f"Date: {dt.date.today().isoformat()}  ",
        *(f"{note}  " for note in notes[:-1]),
        *notes[-1:],
        "",
    ]
    for grid in grids:
        lines += markdown(grid)
    write_section(args.write, section, "\n".join(lines).rstrip("\n"))
    out.print(f"wrote {args.write}")


def fast_loop() -> asyncio.AbstractEventLoop:
    """A uvloop event loop when uvloop is installed (as the gateway runs), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
