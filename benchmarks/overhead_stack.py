"""The three targets of ``bench_overhead.py``: one emulated engine reached directly,
through the aiohttp pass-through and through sluicegate, started as child processes on
free loopback ports; and the pid of each by role."""

from __future__ import annotations

import os
from pathlib import Path

from sluicegate.demo.processes import Children, free_port

MODEL = "overhead-llm"
TARGETS = ("direct", "pass-through", "sluicegate")
ROLES = {"engine": "emulate", "pass-through": "passthrough", "sluicegate": "serve"}
PROMPT_TOKENS = 16
GATEWAY_CONFIG = """\
server: {{host: 127.0.0.1, port: {port}, admin_key_env: null, scrape_interval_s: 1.0}}
models:
  - name: {model}
    backends: [{{name: e0, url: "http://127.0.0.1:{engine}", engine: emulator}}]
    max_concurrency: 256
    lanes:
      - {{name: interactive, max_concurrency: 256, max_queue: 4096, queue_timeout_s: 30,
          slo_ms: 20000, policy: slack, preemptible: never}}
      - {{name: batch, max_concurrency: 16, max_queue: 2048, queue_timeout_s: 300,
          slo_ms: 120000, policy: fair, preemptible: {{after_fraction: 0.8}}}}
      - {{name: best_effort, max_concurrency: 8, max_queue: 8192, queue_timeout_s: 600,
          slo_ms: 600000, policy: fifo, preemptible: always}}
"""


def start_targets(group: Children, preset: str, log_dir: Path) -> dict[str, str]:
    """Start the engine, the pass-through and the gateway; return each target's base URL."""
    engine, passthrough, gateway = free_port(), free_port(), free_port()
    args = ["emulate", "--port", str(engine), "--preset", preset, "--model", MODEL]
    group.start("engine", args, f"http://127.0.0.1:{engine}/health")
    group.start(
        "pass-through",
        ["passthrough", "--port", str(passthrough), "--backend", f"http://127.0.0.1:{engine}"],
        f"http://127.0.0.1:{passthrough}/health",
    )
    config = log_dir / "gateway.yaml"
    config.write_text(GATEWAY_CONFIG.format(port=gateway, model=MODEL, engine=engine))
    group.start(
        "sluicegate", ["serve", "--config", str(config)], f"http://127.0.0.1:{gateway}/readyz"
    )
    urls = (engine, passthrough, gateway)
    return {name: f"http://127.0.0.1:{port}" for name, port in zip(TARGETS, urls, strict=True)}


def child_pids() -> dict[str, int]:
    """Role → pid of this process's ``python -m sluicegate`` children (Linux ``/proc``)."""
    found: dict[str, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[1]) != os.getpid() or b"sluicegate" not in argv:
            continue
        command = argv[argv.index(b"sluicegate") + 1].decode()
        found.update({role: int(entry.name) for role, cmd in ROLES.items() if cmd == command})
    return found
