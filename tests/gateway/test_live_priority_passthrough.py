"""Priority passthrough on the wire: an emulator running vLLM's priority scheduler with one
sequence at a time (``max_num_seqs`` 1), behind a real gateway on loopback. One background
request (priority 4) runs, three more wait in the engine's queue, then a chat request
(priority 1) joins them. With ``priority_passthrough`` the engine gets each priority and
runs the chat request as soon as the running one ends, ahead of the three queued before it;
without, the gateway strips the field, so the same engine sees priority 0 everywhere and
runs them first come, first served. The order is the order the answers reach the clients."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial

from sluicegate.config import parse_config
from sluicegate.emulator import build_app as build_emulator
from sluicegate.engine import preset
from sluicegate.gateway.app import build_app as build_gateway
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    MODEL,
    engine_stats,
    http_call,
    start_server,
    stop_servers,
    wait_until,
)

# 10 ms a step, one sequence: the first request's 200 tokens hold the engine ~2 s, long
# enough to queue four more behind it; each of those takes ~0.2 s.
ENGINE = replace(preset("tiny"), max_num_seqs=1, base_s=0.01, scheduling_policy="priority")
HOLDER_TOKENS, QUEUED_TOKENS = 200, 20


@contextmanager
def priority_stack(passthrough: bool) -> Iterator[tuple[str, str]]:
    """The priority emulator and a gateway in front of it, with or without passthrough,
    letting in up to 8 requests (so the queue is the engine's); their URLs."""
    running = [start_server(build_emulator(ENGINE, model=MODEL))]
    try:
        engine = f"http://127.0.0.1:{running[0].port}"
        config = parse_config(
            f"models:\n  - name: {MODEL}\n    max_concurrency: 8\n"
            "    max_inflight_tokens: off\n"
            f"    backends:\n      - {{name: e0, url: '{engine}', engine: emulator,"
            f" priority_passthrough: {str(passthrough).lower()}}}\n"
        )
        app = build_gateway(config, environ={"SLUICEGATE_ADMIN_KEY": ADMIN_KEY}, scrape=False)
        running.append(start_server(app))
        yield f"http://127.0.0.1:{running[-1].port}", engine
    finally:
        stop_servers(running)


def _holds(engine: str, count: int) -> bool:
    """Whether the engine holds ``count`` requests, running or waiting."""
    stats = engine_stats(engine)
    return int(stats["running"] + stats["waiting"]) == count


def finishing_order(passthrough: bool) -> list[str]:
    """Send ``hold`` (priority 4), then ``b1``–``b3`` (4), then ``chat`` (1) through the
    gateway, each once the engine holds the one before (running or waiting); the names in
    the order their answers arrived."""
    with priority_stack(passthrough) as (base, engine):
        return _send_all(base, engine)


def _send_all(base: str, engine: str) -> list[str]:
    done: list[str] = []
    errors: list[str] = []

    def send(name: str, priority: int, tokens: int) -> None:
        body = {
            "model": MODEL, "prompt": name, "max_tokens": tokens, "ignore_eos": True,
            "priority": priority,
        }  # fmt: skip
        reply = http_call(base, "POST", "/v1/completions", json=body, timeout=30)
        if reply.status != 200:
            errors.append(f"{name}: {reply.status} {reply.body!r}")
        done.append(name)

    threads = []
    plan = [("hold", 4, HOLDER_TOKENS), ("b1", 4, QUEUED_TOKENS), ("b2", 4, QUEUED_TOKENS)]
    plan += [("b3", 4, QUEUED_TOKENS), ("chat", 1, QUEUED_TOKENS)]
    for queued, (name, priority, tokens) in enumerate(plan):
        thread = threading.Thread(target=send, args=(name, priority, tokens))
        thread.start()
        threads.append(thread)
        assert wait_until(partial(_holds, engine, queued + 1), within_s=5), (
            f"{name} did not reach the engine"
        )
    stats = engine_stats(engine)
    assert (stats["running"], stats["waiting"]) == (1, 4), stats
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    return done


def test_with_passthrough_the_engine_runs_chat_ahead_of_queued_background() -> None:
    """The chat request, sent last, finishes second: right after the one that was running
    (vLLM V1 never preempts a running request to admit a waiting one), before the three
    background requests queued before it, which keep their arrival order."""
    assert finishing_order(passthrough=True) == ["hold", "chat", "b1", "b2", "b3"]


def test_without_passthrough_the_same_engine_runs_them_in_arrival_order() -> None:
    """The same priority engine and requests, but the gateway takes the ``priority`` field
    out: every request is priority 0 to the engine, and the chat request finishes last."""
    assert finishing_order(passthrough=False) == ["hold", "b1", "b2", "b3", "chat"]
