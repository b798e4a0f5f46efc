"""The batch lane under ``kill -9`` (issue 17's acceptance test), with real processes.

Engines are ``sluicegate emulate``, the gateway ``sluicegate serve`` (one process, or
``--workers 2`` sharing the SQLite file), the client the official ``openai`` SDK. The
gateway is killed with SIGKILL — no shutdown, no flush — and started again on the same
port and database. Whatever was answered 200 (an upload, a create) must still be there,
every batch must complete, and every ``custom_id`` must have exactly one line across the
output and error files: lines that were in flight run again at the engines (that is
expected and counted), but never appear twice in the output.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Final

import orjson
import pytest

from tests.batches.process_stack import (
    BatchStack,
    StackSpec,
    assert_exactly_once,
    chat_lines,
    custom_ids,
    running_stack,
    upload,
    wait_ended,
    wait_for,
)

ENDPOINT: Final = "/v1/chat/completions"
KILL_SEED = int(os.environ.get("SLUICEGATE_KILL_SEED", "17"))
"""Seeds the kill moments; the test prints it with them (set it to replay a run)."""

# ``tiny`` engines (~3.5 ms steps, 32 sequences each) and 32-token answers: a line takes
# ~0.1 s at the engine, so 5,000 lines keep two engines busy for about 10 s, long enough
# for three kills to land while lines run.
LOAD = StackSpec(engines=2, preset="tiny", max_num_seqs=32, max_concurrency=64)
LOAD_LINES = 5_000
LOAD_TOKENS = 32


def check_completed(stack: BatchStack, batch_id: str, lines: list[bytes]) -> None:
    """The batch ended ``completed`` with every line answered 200 exactly once, no error
    lines, and request_counts saying so."""
    client = stack.client()
    batch = wait_ended(client, batch_id, timeout_s=180)
    assert batch.status == "completed", (batch, stack.logs())
    wanted = [orjson.loads(line)["custom_id"] for line in lines]
    output, answers = custom_ids(client, batch.output_file_id)
    errors, error_lines = custom_ids(client, batch.error_file_id)
    assert error_lines == []
    assert_exactly_once(wanted, output, errors)
    assert {a["response"]["status_code"] for a in answers} == {200}
    assert all(a["response"]["body"]["choices"] for a in answers)
    counts = batch.request_counts
    assert counts is not None
    assert (counts.total, counts.completed, counts.failed) == (len(lines), len(lines), 0)


@pytest.mark.slow
def test_5000_lines_survive_three_kill_9_of_the_gateway(tmp_path: Path) -> None:
    """5,000 lines; the gateway is killed with SIGKILL three times at seeded random moments
    while lines run (each time some lines were claimed, in flight, and fewer than all
    done), and started again on the same port and database. The batch completes; counting
    across its output and error files, no custom_id is duplicated and none is lost, every
    line was answered 200, and request_counts are 5,000/5,000/0. Prints the kill moments,
    the time to complete and how many lines ran more than once at the engines."""
    rng = random.Random(KILL_SEED)
    delays = [round(rng.uniform(0.5, 2.5), 3) for _ in range(3)]
    lines = chat_lines(LOAD_LINES, max_tokens=LOAD_TOKENS)
    with running_stack(LOAD, tmp_path) as stack:
        client = stack.client()
        started = time.monotonic()
        batch = client.batches.create(
            input_file_id=upload(client, lines).id, endpoint=ENDPOINT, completion_window="24h"
        )
        kills: list[dict[str, float]] = []
        for delay in delays:
            time.sleep(delay)
            seen = client.batches.retrieve(batch.id)
            done = seen.request_counts.completed if seen.request_counts else 0
            assert seen.status in ("validating", "in_progress"), seen
            assert done < LOAD_LINES, seen
            at = time.monotonic() - started
            stack.kill_gateway()
            in_flight = stack.running_lines()
            kills.append({"at_s": round(at, 2), "completed": done, "in_flight": in_flight})
            stack.start_gateway()
        check_completed(stack, batch.id, lines)
        elapsed = time.monotonic() - started
        admitted = stack.engine_admitted()
    print(
        f"\nkill -9 durability: seed {KILL_SEED}, delays after (re)start {delays} s;"
        f" kills {kills}; completed in {elapsed:.1f} s;"
        f" engine runs {admitted} for {LOAD_LINES} lines ({admitted - LOAD_LINES} re-runs)"
    )
    assert admitted >= LOAD_LINES
    # The kills must have caught lines in flight, or the test would prove nothing about
    # re-running them.
    assert sum(kill["in_flight"] for kill in kills) > 0, kills


def test_an_upload_answered_200_survives_kill_9(tmp_path: Path) -> None:
    """A 2,000-line upload answered 200, then SIGKILL at once: after a restart the file is
    listed and retrieved with the same id, name, size and line count, and its content is
    byte for byte what was uploaded."""
    lines = chat_lines(2_000, prefix="up")
    data = b"".join(line + b"\n" for line in lines)
    with running_stack(StackSpec(engines=1), tmp_path) as stack:
        uploaded = upload(stack.client(), lines, name="kept.jsonl")
        stack.kill_gateway()
        stack.start_gateway()
        client = stack.client()
        found = client.files.retrieve(uploaded.id)
        listed = [f.id for f in client.files.list()]
        content = client.files.content(uploaded.id).read()
    assert (found.id, found.filename, found.bytes, found.purpose) == (
        uploaded.id,
        "kept.jsonl",
        len(data),
        "batch",
    )
    assert uploaded.id in listed
    assert content == data


def test_a_batch_created_then_killed_before_validation_completes(tmp_path: Path) -> None:
    """A create answered 200 (``validating``), then SIGKILL before the runner looked at it
    (its poll is 5 s; the database still says ``validating`` after the kill): after a
    restart the batch is validated, runs, and completes with each of its 300 lines
    answered exactly once."""
    spec = StackSpec(engines=1, batches={"lease_s": 2, "poll_interval_s": 5})
    lines = chat_lines(300, prefix="early")
    with running_stack(spec, tmp_path) as stack:
        client = stack.client()
        file_id = upload(client, lines).id
        time.sleep(1.0)  # the runner's first look (at start) is over; the next is 5 s away
        created = client.batches.create(
            input_file_id=file_id, endpoint=ENDPOINT, completion_window="24h"
        )
        stack.kill_gateway()
        assert created.status == "validating"
        assert stack.db_status(created.id) == "validating"
        stack.start_gateway()
        check_completed(stack, created.id, lines)


def test_kill_9_of_one_of_two_workers_mid_run(tmp_path: Path) -> None:
    """``serve --workers 2`` on one SQLite file, 3,000 lines: one worker is killed with
    SIGKILL while it holds claimed lines; the supervisor starts another in its place, the
    dead worker's lines run again once their lease ends, and the batch completes with
    each custom_id answered exactly once."""
    spec = StackSpec(engines=2, preset="tiny", max_num_seqs=32, max_concurrency=64, workers=2)
    lines = chat_lines(3_000, prefix="w", max_tokens=LOAD_TOKENS)
    with running_stack(spec, tmp_path) as stack:
        client = stack.client()
        batch = client.batches.create(
            input_file_id=upload(client, lines).id, endpoint=ENDPOINT, completion_window="24h"
        )
        pids = stack.worker_pids()
        victim = pids[1]
        wait_for(lambda: stack.running_lines(victim) > 0, 60, f"worker {victim} to claim lines")
        os.kill(victim, signal.SIGKILL)
        in_flight = stack.running_lines(victim)
        wait_for(
            lambda: len(stack.worker_pids()) == 2 and victim not in stack.worker_pids().values(),
            60,
            "the supervisor to restart the worker",
        )
        check_completed(stack, batch.id, lines)
        admitted = stack.engine_admitted()
    print(
        f"\nworkers: killed worker pid {victim} holding {in_flight} lines;"
        f" engine runs {admitted} for {len(lines)} lines"
    )
    assert in_flight > 0


def test_the_exactly_once_check_counts_duplicates_and_losses() -> None:
    """The check the kill tests rely on fails on a duplicated line, a lost one and an
    unknown one, and passes (0 duplicates, 0 lost) on exactly one line each."""
    wanted = ["a", "b", "c"]
    assert assert_exactly_once(wanted, ["a", "b"], ["c"]) == (0, 0)
    for output, errors in ((["a", "b", "c"], ["a"]), (["a", "b"], []), (["a", "b", "c", "d"], [])):
        with pytest.raises(AssertionError):
            assert_exactly_once(wanted, output, errors)
