"""Where a gateway's CPU goes per request, before and after: py-spy on two builds at once.

Two sluicegate gateways run side by side in front of one fake upstream
(``fake_upstream.py``): the checkout's, and one from an earlier revision
(``--baseline REV``, checked out with ``git worktree`` into a temporary directory
and run from its ``src``), or from any source directory (``--baseline-src``).
The lean generator offers both the same open-loop rate, interleaved
(``floor_stack.paced``), while ``py-spy record`` samples each gateway; the aiohttp
pass-through runs too, as the yardstick of the CPU per request.

Each gateway's samples are sorted by the frame that was running (its innermost
frame) into layers: the event loop itself (uvloop's C code, syscalls included),
the HTTP server (uvicorn), the upstream client (aiohttp, or ``gateway/upstream/http1.py``),
the scheduler (``sluicegate/core``), the rest of the gateway, metrics
(prometheus-client), Starlette, and the rest. A layer's µs per request is its share
of the samples × the process's CPU per request (/proc, over the same window).

    python benchmarks/profile_gateway.py --baseline REV [--rate 300] [--duration 20]
        [--write docs/BENCHMARKS.md]

Needs ``py-spy`` (a dev dependency) and permission to ptrace the children (root, or
``kernel.yama.ptrace_scope`` 0).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

import fake_upstream
from floor_stack import KEY, KEY_ENV, LANE_SETUPS, gateway_config, paced
from livestack import Process, fast_loop, write_report
from overhead_stack import MODEL
from sluicegate.demo.processes import Children, children, free_port
from tables import Grid, cells

LAYERS = (
    "event loop (uvloop, syscalls)",
    "HTTP server (uvicorn)",
    "upstream client",
    "scheduler (core)",
    "gateway (the rest of sluicegate)",
    "metrics (prometheus-client)",
    "Starlette",
    "other",
)
BODY = (
    b'{"model":"' + MODEL.encode() + b'","max_tokens":2,'
    b'"messages":[{"role":"user","content":"hello there, general kenobi"}]}'
)


def layer(frame: str) -> str:
    """The layer of a py-spy frame ``function (path:line)``."""
    path = frame.rpartition("(")[2]
    if "asyncio/runners.py" in path or "uvloop" in path:
        return LAYERS[0]
    if "uvicorn/" in path:
        return LAYERS[1]
    if (
        "aiohttp/" in path
        or "gateway/upstream/http1.py" in path
        or "gateway/upstream/clients.py" in path
    ):
        return LAYERS[2]
    if "sluicegate/core/" in path:
        return LAYERS[3]
    if "sluicegate/" in path:
        return LAYERS[4]
    if "prometheus_client/" in path:
        return LAYERS[5]
    if "starlette/" in path:
        return LAYERS[6]
    return LAYERS[7]


def shares(raw: Path) -> dict[str, float]:
    """Share of all samples per layer, from a py-spy ``--format raw`` file."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack:
            counts[layer(stack.rsplit(";", 1)[-1])] += int(n)
    total = sum(counts.values()) or 1
    return {name: counts[name] / total for name in LAYERS}


@contextlib.contextmanager
def baseline_source(args: argparse.Namespace) -> Iterator[Path]:
    """The baseline's ``src`` directory: given, or a worktree of ``--baseline``."""
    if args.baseline_src is not None:
        yield Path(args.baseline_src)
        return
    where = Path(tempfile.mkdtemp(prefix="sluicegate-baseline-"))
    tree = where / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.baseline], check=True)
    try:
        yield tree / "src"
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], check=False)
        shutil.rmtree(where, ignore_errors=True)


def profile(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    """Start ``py-spy record`` on ``pid`` for ``seconds`` (raw format into ``out``)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    argv = [spy, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "250"]
    argv += ["-f", "raw", "-o", str(out), "--nonblocking", "--full-filenames"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def start_targets(group: Children, old_src: Path, log_dir: Path, setup: str) -> dict[str, Process]:
    """The fake upstream, then the pass-through and both gateways in front of it."""
    engine = free_port()
    base = f"http://127.0.0.1:{engine}"
    group.run("upstream", fake_upstream.command(engine, MODEL), base + "/health")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["passthrough", "--port", str(port), "--backend", base]
    targets = {
        "pass-through": Process("pass-through", url, group.start("pass", argv, url + "/health"))
    }
    for name, src in (("before", old_src), ("after", None)):
        port, config = free_port(), log_dir / f"{name}.yaml"
        config.write_text(gateway_config(setup, port=port, engine=engine, kind="vllm"))
        url = f"http://127.0.0.1:{port}"
        env = {"PYTHONPATH": str(src)} if src is not None else None
        pid = group.start(name, ["serve", "--config", str(config)], url + "/readyz", env=env)
        targets[name] = Process(name, url, pid)
    return targets


def run(args: argparse.Namespace, log_dir: Path, console: Console) -> list[Grid]:
    """Start everything, load and profile, and tabulate."""
    os.environ[KEY_ENV] = KEY
    n = int(args.rate * args.duration)
    with baseline_source(args) as old_src, children(log_dir) as group:
        processes = start_targets(group, old_src, log_dir, args.config)
        urls = {name: p.url + "/v1/chat/completions" for name, p in processes.items()}
        start = {name: p.cpu_s() for name, p in processes.items()}
        spies = {
            name: profile(processes[name].pid, args.duration - 2, log_dir / f"{name}.raw")
            for name in ("before", "after")
        }
        loop = fast_loop()
        try:
            samples = loop.run_until_complete(
                paced(urls, n, args.rate, BODY, stream=False, timeout_s=30.0)
            )
        finally:
            loop.close()
        used = {name: p.cpu_s() - start[name] for name, p in processes.items()}
        for spy in spies.values():
            spy.wait(timeout=60)
    errors = {name: sum(1 for s in got if s[4]) for name, got in samples.items()}
    cpu_us = {name: used[name] / n * 1e6 for name in urls}
    layers = {name: shares(log_dir / f"{name}.raw") for name in ("before", "after")}
    grid: Grid = (
        f"CPU µs per request by layer, {args.rate:g} req/s (sluicegate before and after)",
        cells("layer|before: share|before: µs/req|after: share|after: µs/req"),
        [
            [
                name,
                f"{layers['before'][name]:.1%}",
                f"{layers['before'][name] * cpu_us['before']:.0f}",
                f"{layers['after'][name]:.1%}",
                f"{layers['after'][name] * cpu_us['after']:.0f}",
            ]
            for name in LAYERS
        ]
        + [["whole process", "100%", f"{cpu_us['before']:.0f}", "100%", f"{cpu_us['after']:.0f}"]],
    )
    totals: Grid = (
        "CPU µs per request, same run",
        cells("target|CPU µs/req|vs pass-through|errors"),
        [
            [
                name,
                f"{cpu_us[name]:.0f}",
                f"{cpu_us[name] / cpu_us['pass-through']:.2f}×",
                str(errors[name]),
            ]
            for name in urls
        ],
    )
    console.print(f"logs and raw profiles: {log_dir}")
    return [grid, totals]


def main(argv: list[str] | None = None) -> int:
    """Profile, print, and optionally write the section."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--baseline", default="HEAD~1", help="git revision of 'before'")
    parser.add_argument("--baseline-src", default=None, help="or: a src directory to run")
    parser.add_argument("--rate", type=float, default=300.0, help="req/s per target")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load")
    parser.add_argument(
        "--config", choices=sorted(LANE_SETUPS), default="never",
        help="the lane's set-up (see bench_floor.py --config)",
    )  # fmt: skip
    parser.add_argument("--section", default="profile_gateway", help="section --write replaces")
    parser.add_argument(
        "--title",
        default="Where a request's CPU goes: profile before and after (issue 18)",
        help="heading of the section --write replaces",
    )
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args(argv)
    console = Console(width=140)
    log_dir = Path(tempfile.mkdtemp(prefix="sluicegate-profile-"))
    grids = run(args, log_dir, console)
    notes = [
        f"Before: `{args.baseline_src or args.baseline}`; after: this checkout. Both gateways "
        f"(one model, one slack lane set up `{args.config}`, one keyed tenant, metrics and a "
        "1 s scrape on) run at "
        "once in front of `fake_upstream.py`, with the aiohttp pass-through beside them; "
        f"{args.rate:g} req/s each, interleaved, for {args.duration:g} s; `py-spy record "
        "-r 250` on each gateway. A layer is the innermost frame's module; µs/req = its share "
        "of samples × the process's CPU per request.",
    ]
    write_report(
        args, script="profile_gateway.py", section=args.section,
        title=args.title,
        notes=notes, grids=grids, argv=argv, out=console,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
