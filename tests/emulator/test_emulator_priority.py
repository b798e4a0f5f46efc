"""vLLM's ``priority`` request field on the emulator: parsed, refused as vLLM refuses it, and
obeyed by an engine started with the priority policy (real HTTP on loopback)."""

from __future__ import annotations

import dataclasses
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from sluicegate.cli import app
from sluicegate.demo.processes import free_port
from sluicegate.emulator.openai_wire import PRIORITY_BOUND, parse_request
from sluicegate.engine import EngineConfig, preset
from tests.distributed.cluster import spawn, stop_children, wait_ready
from tests.emulator.emulator_harness import MODEL, LiveEmulator

StartEmulator = Callable[..., AbstractContextManager[LiveEmulator]]


def post(live: LiveEmulator, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    """POST ``body`` to /v1/completions; the status and the JSON answer."""
    request = urllib.request.Request(
        live.base_url + "/v1/completions", data=orjson.dumps(body),
        headers={"content-type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, orjson.loads(resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, orjson.loads(err.read())


def by_priority(tiny: EngineConfig, **changes: object) -> EngineConfig:
    """The tiny preset with the priority policy (and ``changes``)."""
    return dataclasses.replace(tiny, scheduling_policy="priority", **changes)  # type: ignore[arg-type]


def test_priority_defaults_to_zero_and_parses_an_integer() -> None:
    """Absent: 0; an integer, negative or the 64-bit bounds: kept as given."""
    for given, expected in [(None, 0), (3, 3), (-2, -2), (PRIORITY_BOUND - 1, PRIORITY_BOUND - 1),
                            (-PRIORITY_BOUND, -PRIORITY_BOUND)]:  # fmt: skip
        body: dict[str, object] = {"prompt": "a"}
        if given is not None:
            body["priority"] = given
        assert parse_request(orjson.dumps(body), chat=False, model=MODEL).priority == expected


@pytest.mark.parametrize("value", ["1", 1.5, True, PRIORITY_BOUND])
def test_a_priority_that_is_not_a_64_bit_integer_is_400_in_openai_shape(
    start_emulator: StartEmulator, tiny: EngineConfig, value: object
) -> None:
    """A string, a float, a boolean or a number past 64 bits: 400, param ``priority``."""
    with start_emulator(by_priority(tiny)) as live:
        status, body = post(live, {"prompt": "a", "max_tokens": 2, "priority": value})
        assert live.stats()["admitted_total"] == 0
    assert status == 400
    error = body["error"]
    assert isinstance(error, dict)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "priority"


def test_an_fcfs_engine_refuses_a_non_zero_priority_as_vllm_does(emulator: LiveEmulator) -> None:
    """vLLM started without the priority policy answers 400 "Got priority 2 but Priority
    scheduling is not enabled."; priority 0 is served."""
    status, body = post(emulator, {"prompt": "a", "max_tokens": 2, "priority": 2})
    assert status == 400
    error = body["error"]
    assert isinstance(error, dict)
    assert error["message"] == "Got priority 2 but Priority scheduling is not enabled."
    assert error["param"] == "priority"
    assert emulator.stats()["admitted_total"] == 0
    status, _ = post(emulator, {"prompt": "a", "max_tokens": 2, "priority": 0})
    assert status == 200


def test_a_priority_engine_serves_the_lower_priority_value_first(
    start_emulator: StartEmulator, tiny: EngineConfig
) -> None:
    """One sequence slot, busy: a priority-5 request then a priority-0 one queue behind it;
    the priority-0 one, though it came second, finishes first."""
    with start_emulator(by_priority(tiny, max_num_seqs=1)) as live, ThreadPoolExecutor(3) as pool:
        done: dict[str, float] = {}

        def send(name: str, priority: int, tokens: int) -> int:
            body = {"prompt": "a", "max_tokens": tokens, "ignore_eos": True, "priority": priority}
            status, _ = post(live, body)
            done[name] = time.monotonic()
            return status

        blocker = pool.submit(send, "blocker", 9, 300)
        assert live.wait_for(lambda s: s["running"] == 1, within_s=5)
        low = pool.submit(send, "low", 5, 5)
        assert live.wait_for(lambda s: s["waiting"] == 1, within_s=5)
        high = pool.submit(send, "high", 0, 5)
        assert live.wait_for(lambda s: s["waiting"] == 2, within_s=5)
        assert [f.result(timeout=30) for f in (blocker, low, high)] == [200, 200, 200]
    assert done["blocker"] < done["high"] < done["low"]


def test_emulate_takes_the_scheduling_policy_flag(tmp_path: Path) -> None:
    """``sluicegate emulate --scheduling-policy priority`` (a real process) serves a request of
    priority 3, which the default fcfs would refuse; an unknown policy exits 1 saying why."""
    port = free_port()
    args = ["emulate", "--port", str(port), "--model", MODEL, "--scheduling-policy", "priority"]
    child = spawn(f"emulate-{port}", args, port, tmp_path, {})
    try:
        wait_ready([(child, "/health")])
        live = LiveEmulator(port, dataclasses.replace(preset("tiny"), scheduling_policy="priority"))
        status, body = post(live, {"prompt": "a", "max_tokens": 2, "priority": 3})
    finally:
        stop_children([child])
    assert status == 200, body
    result = CliRunner().invoke(app, ["emulate", "--scheduling-policy", "sjf"])
    assert result.exit_code == 1
    assert "scheduling policy must be one of ['fcfs', 'priority'], got 'sjf'" in result.output
