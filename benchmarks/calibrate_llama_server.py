"""Calibrate the emulator preset ``llama-server-tiny-cpu`` from llama-server's own step times.

Starts ``llama-server`` the way the real-engine tests do (the harness in
``tests/realengine/llama_cpp_server.py``: ``--parallel 4 -c 8192 --threads 1``) on
the tiny GGUF the tests write, and reads the per-request ``timings`` it returns
(server-side, so HTTP and the client are not in them):

* prefill: one request at a time, a prompt of N token ids that is never cached
  (``cache_prompt: false``), one token out. ``prompt_ms`` is one step that
  prefills N tokens (N ≤ ``n_batch`` 2048) and samples the first token.
* decode: B = 1..4 requests started together, each ``DECODE_TOKENS`` tokens out
  (``ignore_eos``). ``predicted_per_token_ms`` (generation time over n − 1
  steps) is the step time with B sequences decoding; once with short prompts,
  once with long ones, whose steps attend to ~10× more KV.

Fits ``EngineConfig``'s ``base_s``, ``per_prefill_token_s``,
``per_decode_seq_s`` and ``per_kv_token_s`` by least squares on the relative
error (coefficients ≥ 0) and prints the measured table, the model's figure per
row, and the preset entry; ``--write FILE`` puts them in a section of FILE.

    python benchmarks/calibrate_llama_server.py [--repeats 5] [--write docs/BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.realengine.llama_cpp_server import LLAMA_SERVER_VERSION, LlamaCppServer, llama_cpp_server
from tests.realengine.tiny_gguf import write_tiny_gguf

from livestack import CpuMeter, Process, machine_busy_s, wide_console, write_report
from sluicegate.engine.engine_config import EngineConfig
from tables import Grid

PARALLEL = 4
CTX = 8192
N_BATCH = 2048  # llama-server's default logical batch: the most tokens one step takes
PREFILL_TOKENS = (64, 128, 256, 512, 768, 1024, 1536)
DECODE_TOKENS = 128
PREFILL_SAMPLES_PER_REPEAT = 3
DECODE_PROMPTS = (32, 512, 1024)
PRESET = "llama-server-tiny-cpu"
QUIET_CORES, QUIET_WAIT_S = 0.3, 5.0  # wait for other processes to calm down
THREADS = 0  # llama-server --threads; 0: the harness's (1), as the tests start it
TEXT = "the quick brown fox jumps over the lazy dog; a patient sluice keeper opens one gate. "


@dataclass(frozen=True, slots=True)
class Measurement:
    """One measured configuration: the median step time over its samples.

    Attributes:
        kind: ``prefill`` (a step prefilling ``prompt`` tokens) or ``decode``
            (a step in which ``batch`` sequences each decode one token).
        prompt: prompt tokens per request (as llama-server counted them).
        batch: requests in the step.
        output: tokens out per request.
        step_ms: median measured step time, milliseconds.
        spread_ms: (min, max) over the samples.
        samples: how many samples.
    """

    kind: str
    prompt: int
    batch: int
    output: int
    step_ms: float
    spread_ms: tuple[float, float]
    samples: int

    def row(self) -> list[float]:
        """Its design row: the step's (1, prefill tokens, decode seqs, KV tokens attended)."""
        if self.kind == "prefill":
            return [1.0, float(self.prompt), 0.0, float(self.prompt)]
        context = self.prompt + self.output / 2  # mean context over the decode steps
        return [1.0, 0.0, float(self.batch), self.batch * context]


def post(server: LlamaCppServer, path: str, body: dict[str, Any]) -> Any:
    """``POST path`` with a JSON body; the decoded JSON answer."""
    request = urllib.request.Request(
        server.url + path, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return orjson.loads(response.read())


def token_ids(server: LlamaCppServer, count: int, salt: int) -> list[int]:
    """``count`` token ids of text that starts with ``salt`` (so no two prompts share a head)."""
    text = f"{salt}: " + TEXT * (count // 40 + 2)
    tokens: list[int] = post(server, "/tokenize", {"content": text})["tokens"]
    assert len(tokens) >= count, (len(tokens), count)
    return tokens[:count]


def complete(server: LlamaCppServer, prompt: list[int], n_predict: int) -> dict[str, float]:
    """One uncached ``/completion`` of ``n_predict`` tokens; its ``timings``."""
    body = {
        "prompt": prompt, "n_predict": n_predict, "cache_prompt": False, "ignore_eos": True,
        "temperature": 0.0,
    }  # fmt: skip
    timings: dict[str, float] = post(server, "/completion", body)["timings"]
    return timings


def together(server: LlamaCppServer, prompts: Sequence[list[int]]) -> list[dict[str, float]]:
    """Send one ``DECODE_TOKENS`` completion per prompt at once; their ``timings``."""
    results: list[dict[str, float]] = [{} for _ in prompts]
    barrier = threading.Barrier(len(prompts))

    def run(i: int) -> None:
        barrier.wait()
        results[i] = complete(server, prompts[i], DECODE_TOKENS)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def wait_quiet(limit_s: float = QUIET_WAIT_S) -> float:
    """Wait (at most ``limit_s``) until other processes keep under ``QUIET_CORES`` cores busy
    over half a second (our server is idle between samples); the last level seen."""
    deadline = time.monotonic() + limit_s
    while True:
        before = machine_busy_s()
        time.sleep(0.5)
        busy = (machine_busy_s() - before) / 0.5
        if busy < QUIET_CORES or time.monotonic() > deadline:
            return busy
        time.sleep(2.0)


def summarize(kind: str, batch: int, output: int, samples: list[tuple[int, float]]) -> Measurement:
    """A ``Measurement`` from (prompt tokens, step ms) samples."""
    times = [ms for _, ms in samples]
    prompt = round(statistics.median(n for n, _ in samples))
    return Measurement(
        kind, prompt, batch, output, statistics.median(times), (min(times), max(times)),
        len(times),
    )  # fmt: skip


def measure(server: LlamaCppServer, repeats: int, background: list[float]) -> list[Measurement]:
    """The prefill and decode measurements (see the module docstring); each sample waits for
    a quiet machine first and appends the background level it started at to ``background``."""
    salt = 0
    table: list[Measurement] = []
    # Warm-up: the first steps of each shape allocate compute buffers.
    complete(server, token_ids(server, max(PREFILL_TOKENS), -1), 16)
    together(server, [token_ids(server, 64, -2 - i) for i in range(PARALLEL)])
    for n in PREFILL_TOKENS:
        samples = []
        for _ in range(PREFILL_SAMPLES_PER_REPEAT * repeats):  # short steps: noisier
            salt += 1
            prompt = token_ids(server, n, salt)
            background.append(wait_quiet())
            timings = complete(server, prompt, 1)
            samples.append((int(timings["prompt_n"]), float(timings["prompt_ms"])))
        table.append(summarize("prefill", 1, 1, samples))
    for length in DECODE_PROMPTS:
        for batch in range(1, PARALLEL + 1):
            samples = []
            for _ in range(repeats):
                prompts = []
                for _ in range(batch):
                    salt += 1
                    prompts.append(token_ids(server, length, salt))
                background.append(wait_quiet())
                for timings in together(server, prompts):
                    samples.append((int(timings["prompt_n"]), timings["predicted_per_token_ms"]))
            table.append(summarize("decode", batch, DECODE_TOKENS, samples))
    return table


def fit(table: Sequence[Measurement]) -> np.ndarray:
    """Non-negative least squares on relative error: (base, prefill, decode, kv) in seconds."""
    rows = np.array([m.row() for m in table])
    seconds = np.array([m.step_ms / 1000.0 for m in table])
    weights = 1.0 / seconds
    active = list(range(rows.shape[1]))
    while True:
        solution, *_ = np.linalg.lstsq(
            rows[:, active] * weights[:, None], seconds * weights, rcond=None
        )
        if (solution >= 0).all() or len(active) == 1:
            break
        del active[int(np.argmin(solution))]  # a negative cost means "none": drop it, refit
    coefficients = np.zeros(rows.shape[1])
    coefficients[active] = np.maximum(solution, 0.0)
    return coefficients


def engine_config(coefficients: np.ndarray) -> EngineConfig:
    """The preset: llama-server's slots and batch, the fitted step-time coefficients."""
    base, prefill, decode, kv = (float(f"{c:.3g}") for c in coefficients)
    return EngineConfig(
        max_num_seqs=PARALLEL, max_num_batched_tokens=N_BATCH, kv_capacity_tokens=CTX,
        block_size=16, base_s=max(base, 1e-6), per_prefill_token_s=prefill,
        per_decode_seq_s=decode, per_kv_token_s=kv,
    )  # fmt: skip


def modelled_ms(config: EngineConfig, m: Measurement) -> float:
    """The step time ``config`` gives the measurement's step, milliseconds."""
    _, prefill, decode, kv = m.row()
    return config.step_s(int(prefill), int(decode), round(kv)) * 1000.0


def table_grid(table: Sequence[Measurement], config: EngineConfig) -> Grid:
    """Measured vs modelled step times."""
    headers = ["step", "prompt tokens", "batch", "tokens out", "samples", "measured ms (median)",
               "min–max ms", "preset ms", "preset / measured"]  # fmt: skip
    rows = []
    for m in table:
        model = modelled_ms(config, m)
        rows.append([
            m.kind, str(m.prompt), str(m.batch), str(m.output), str(m.samples),
            f"{m.step_ms:.3f}", f"{m.spread_ms[0]:.3f}–{m.spread_ms[1]:.3f}", f"{model:.3f}",
            f"{model / m.step_ms:.2f}",
        ])  # fmt: skip
    return "llama-server step times: measured and the fitted preset", headers, rows


def preset_source(config: EngineConfig) -> str:
    """The ``PRESETS`` entry to paste into ``engine/presets.py``."""
    return (
        f'    "{PRESET}": EngineConfig(\n'
        f"        max_num_seqs={config.max_num_seqs},\n"
        f"        max_num_batched_tokens={config.max_num_batched_tokens},\n"
        f"        kv_capacity_tokens={config.kv_capacity_tokens},\n"
        f"        block_size={config.block_size},\n"
        f"        base_s={config.base_s!r},\n"
        f"        per_prefill_token_s={config.per_prefill_token_s!r},\n"
        f"        per_decode_seq_s={config.per_decode_seq_s!r},\n"
        f"        per_kv_token_s={config.per_kv_token_s!r},\n"
        "    ),"
    )


def threads_used(log: Path) -> str:
    """The ``n_threads`` llama-server reported in its log, or ``?``."""
    for line in log.read_text(errors="replace").splitlines():
        if "n_threads =" in line:
            return line.split("n_threads =", 1)[1].split()[0].rstrip(",;")
    return "?"


def main(argv: list[str] | None = None) -> int:
    """Measure, fit, print; optionally write the section."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="samples per configuration")
    parser.add_argument(
        "--threads", type=int, default=THREADS, help="llama-server --threads (0: the harness's, 1)"
    )
    parser.add_argument("--write", type=Path, default=None, help="Markdown file to update")
    args = parser.parse_args(argv)
    extra = ("-t", str(args.threads)) if args.threads else ()
    out = wide_console()
    with tempfile.TemporaryDirectory(prefix="sluicegate-calibrate-") as tmp:
        model = write_tiny_gguf(Path(tmp) / "tiny.gguf")
        log = Path(tmp) / "llama-server.log"
        with llama_cpp_server(model, parallel=PARALLEL, ctx=CTX, log=log, extra=extra) as server:
            meter = CpuMeter([Process("llama-server", server.url, server.pid)])
            started = time.monotonic()
            background: list[float] = []
            table = measure(server, args.repeats, background)
            elapsed = time.monotonic() - started
            others = meter.others_cores()
            threads = threads_used(log)
    config = engine_config(fit(table))
    out.print(preset_source(config))
    out.print("MEASURED = [")
    for m in table:
        out.print(f'    ("{m.kind}", {m.prompt}, {m.batch}, {m.output}, {m.step_ms:.4f}),')
    out.print("]")
    notes = [
        f"Engine: `llama-server` (llama-cpp-python {LLAMA_SERVER_VERSION} sdist) on the tests' "
        f"tiny GGUF, `--parallel {PARALLEL} -c {CTX}`, `--threads {threads}`; step times from its "
        f"per-request `timings` (server side), median of "
        f"{PREFILL_SAMPLES_PER_REPEAT * args.repeats} requests per prefill row and of "
        f"{args.repeats} runs per decode row (of every request's `predicted_per_token_ms`); "
        f"measured in {elapsed:.0f} s.",
        f"Background load: each sample waited (≤ {QUIET_WAIT_S:g} s) for other processes to "
        f"keep < {QUIET_CORES:g} cores busy; at sample starts median "
        f"{statistics.median(background):.2f}, max {max(background):.2f} cores; over the whole "
        f"run {others:.2f} cores.",
        "Fit: least squares on relative error, coefficients ≥ 0; the preset "
        f"`{PRESET}` in `src/sluicegate/engine/presets.py` is base_s "
        f"{config.base_s * 1e3:.3g} ms, per_prefill_token_s {config.per_prefill_token_s * 1e6:.3g} "
        f"µs, per_decode_seq_s {config.per_decode_seq_s * 1e6:.3g} µs, per_kv_token_s "
        f"{config.per_kv_token_s * 1e9:.3g} ns.",
    ]
    write_report(
        args, script="calibrate_llama_server.py", section="calibrate_llama_server",
        title="Calibration: llama-server step times on this machine (preset "
        f"`{PRESET}`)", notes=notes, grids=[table_grid(table, config)], argv=argv, out=out,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
