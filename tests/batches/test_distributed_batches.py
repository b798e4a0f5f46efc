"""The batch lane in distributed mode, end to end, with real processes.

Three ``sluicegate serve`` replicas share one private Redis (``store: redis://…``, no
``batches.path``), with emulated engines as the model's backends and the official
``openai`` SDK as the client: any replica serves any file or batch and runs any line, a
replica killed with SIGKILL leaves its lines to the others after ``batches.lease_s``,
tenancy holds across replicas, and a cancel on one replica stops the lines the others run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import openai
import orjson
import pytest
import yaml

from tests.batches.distributed_stack import Fleet, FleetSpec, fleet_config, running_fleet
from tests.batches.process_stack import (
    assert_exactly_once,
    chat_lines,
    custom_ids,
    upload,
    wait_ended,
    wait_for,
)
from tests.store.redis_server import REDIS_SERVER

ENDPOINT: Final = "/v1/chat/completions"
# ``tiny`` engines (~3.5 ms steps): a 32-token line takes ~0.1 s at the engine, so lines
# stay in flight long enough for a kill or a cancel to land while replicas hold some.
SHARED = FleetSpec(gateways=3, engines=3, preset="tiny", max_num_seqs=64, max_concurrency=48)

pytestmark = pytest.mark.skipif(
    not os.path.exists(REDIS_SERVER),
    reason=f"redis-server not installed ({REDIS_SERVER}); `make test` installs it",
)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Three replicas on one Redis and three ``tiny`` engines, shared by the tests that
    kill nothing (each measures what it caused as differences)."""
    with running_fleet(SHARED, tmp_path_factory.mktemp("fleet")) as running:
        yield running


def wanted_ids(lines: list[bytes]) -> list[str]:
    """The custom_ids of input ``lines``, in order."""
    return [str(orjson.loads(line)["custom_id"]) for line in lines]


def test_a_batch_moves_across_three_replicas(fleet: Fleet) -> None:
    """Upload on replica 1, create on replica 2, poll on replica 3, download from replica
    1: the batch completes with exactly one 200 output line per custom_id (in input
    order), no error file, request_counts 900/900/0; each replica ended some of its lines
    (its ``sluicegate_batch_line_runs_total{outcome="completed"}`` grew), and the three
    together ended as many runs as the engines admitted."""
    lines = chat_lines(900, prefix="move", max_tokens=8)
    before = [fleet.line_runs(i) for i in range(3)]
    admitted_before = fleet.engine_admitted()
    started = time.monotonic()
    file_id = upload(fleet.client(0), lines).id
    created = fleet.client(1).batches.create(
        input_file_id=file_id, endpoint=ENDPOINT, completion_window="24h"
    )
    batch = wait_ended(fleet.client(2), created.id, timeout_s=120)
    elapsed = time.monotonic() - started
    assert batch.status == "completed", (batch, fleet.logs())
    output, answers = custom_ids(fleet.client(0), batch.output_file_id)
    assert batch.error_file_id is None
    assert output == wanted_ids(lines)
    assert {a["response"]["status_code"] for a in answers} == {200}
    counts = batch.request_counts
    assert counts is not None
    assert (counts.total, counts.completed, counts.failed) == (900, 900, 0)
    runs = [fleet.line_runs(i) - before[i] for i in range(3)]
    admitted = fleet.engine_admitted() - admitted_before
    print(
        f"\nthree replicas: 900 lines completed in {elapsed:.1f} s;"
        f" runs per replica {runs}; engine runs {admitted}"
    )
    assert all(run > 0 for run in runs), runs
    assert sum(runs) == admitted >= 900


def test_tenant_b_cannot_see_tenant_a_batch_on_another_replica(fleet: Fleet) -> None:
    """Tenant A uploads and creates a batch on replica 1; on replica 2, A retrieves both,
    while tenant B gets 404 for the batch, its cancel, the file and the file's content,
    and lists neither."""
    lines = chat_lines(20, prefix="tenancy", max_tokens=4)
    file_id = upload(fleet.client(0, "A"), lines).id
    batch_id = (
        fleet.client(0, "A")
        .batches.create(input_file_id=file_id, endpoint=ENDPOINT, completion_window="24h")
        .id
    )
    owner = fleet.client(1, "A")
    assert owner.batches.retrieve(batch_id).id == batch_id
    assert owner.files.retrieve(file_id).id == file_id
    other = fleet.client(1, "B")
    attempts: list[Any] = [
        lambda: other.batches.retrieve(batch_id),
        lambda: other.batches.cancel(batch_id),
        lambda: other.files.retrieve(file_id),
        lambda: other.files.content(file_id),
    ]
    statuses = []
    for attempt in attempts:
        with pytest.raises(openai.NotFoundError) as caught:
            attempt()
        statuses.append(caught.value.status_code)
    assert statuses == [404] * 4
    assert [b.id for b in other.batches.list()] == []
    assert [f.id for f in other.files.list()] == []
    assert wait_ended(owner, batch_id, timeout_s=60).status == "completed"


def test_a_cancel_on_one_replica_stops_the_lines_the_others_run(fleet: Fleet) -> None:
    """2,000 32-token lines; once every replica has ended some of them and the batch is
    not done, replica 1 cancels it: the batch ends ``cancelled``; every custom_id is in
    exactly one of the output and error files, the output lines are 200s, the error
    lines ``batch_cancelled``, some of each, and request_counts say as much."""
    lines = chat_lines(2_000, prefix="cancel", max_tokens=32)
    before = [fleet.line_runs(i) for i in range(3)]
    file_id = upload(fleet.client(0), lines).id
    batch_id = (
        fleet.client(1)
        .batches.create(input_file_id=file_id, endpoint=ENDPOINT, completion_window="24h")
        .id
    )
    wait_for(
        lambda: all(fleet.line_runs(i) > before[i] for i in range(3)),
        60,
        "every replica to end some lines",
    )
    cancelled = fleet.client(0).batches.cancel(batch_id)
    assert cancelled.status == "cancelling", cancelled
    batch = wait_ended(fleet.client(2), batch_id, timeout_s=60)
    assert batch.status == "cancelled", (batch, fleet.logs())
    output, answers = custom_ids(fleet.client(1), batch.output_file_id)
    errors, error_lines = custom_ids(fleet.client(1), batch.error_file_id)
    assert_exactly_once(wanted_ids(lines), output, errors)
    assert {a["response"]["status_code"] for a in answers} == {200}
    assert {e["error"]["code"] for e in error_lines} == {"batch_cancelled"}
    counts = batch.request_counts
    assert counts is not None
    assert (counts.total, counts.completed, counts.failed) == (2_000, len(output), len(errors))
    assert output
    assert errors
    print(f"\ncancel: {len(output)} lines answered, {len(errors)} cancelled")


def test_kill_9_of_a_replica_holding_lines(tmp_path: Path) -> None:
    """2,000 32-token lines on three replicas; once replica 2 has ended 100 lines, it is
    killed with SIGKILL while it holds claimed lines and the batch is not done. The two
    others take those lines over after ``lease_s`` and the batch completes: every
    custom_id exactly once in the output, all 200s, no error file, request_counts
    2,000/2,000/0. Only lines the dead replica held ran twice at the engines (re-runs:
    engine runs minus lines, printed with the time to complete, at most the held lines)."""
    lines = chat_lines(2_000, prefix="kill", max_tokens=32)
    with running_fleet(SHARED, tmp_path) as fleet:
        started = time.monotonic()
        file_id = upload(fleet.client(0), lines).id
        batch_id = (
            fleet.client(0)
            .batches.create(input_file_id=file_id, endpoint=ENDPOINT, completion_window="24h")
            .id
        )
        wait_for(
            lambda: fleet.line_runs(1) >= 100 and fleet.held_lines(batch_id, 1) > 0,
            60,
            "replica 2 to have ended 100 lines and to hold more",
        )
        fleet.kill_gateway(1)
        held = fleet.held_lines(batch_id, 1)
        killed_at = time.monotonic() - started
        done = fleet.client(0).batches.retrieve(batch_id)
        batch = wait_ended(fleet.client(2), batch_id, timeout_s=120)
        elapsed = time.monotonic() - started
        assert batch.status == "completed", (batch, fleet.logs())
        output, answers = custom_ids(fleet.client(0), batch.output_file_id)
        assert batch.error_file_id is None
        assert_exactly_once(wanted_ids(lines), output, [])
        assert {a["response"]["status_code"] for a in answers} == {200}
        counts = batch.request_counts
        assert counts is not None
        assert (counts.total, counts.completed, counts.failed) == (2_000, 2_000, 0)
        admitted = fleet.engine_admitted()
    print(
        f"\nkill -9 of a replica: killed at {killed_at:.1f} s holding {held} lines"
        f" ({done.request_counts}); completed in {elapsed:.1f} s;"
        f" engine runs {admitted} for 2000 lines ({admitted - 2_000} re-runs)"
    )
    assert held > 0
    assert done.status == "in_progress"
    assert done.request_counts is not None
    assert done.request_counts.completed < 2_000
    assert 0 <= admitted - 2_000 <= held


def test_check_config_refuses_batches_path_beside_a_redis_store(tmp_path: Path) -> None:
    """``sluicegate check-config`` (the real CLI) exits 1 on a config with a redis:// store
    and ``batches.path``, naming ``batches.path``; the same config without the path is
    valid (so the path is what it refuses)."""
    config = fleet_config(
        FleetSpec(), port=8000, replica="gw1", engine_ports=[9000], store="redis://127.0.0.1:1/0"
    )

    def check(batches: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump({**config, "batches": batches}, sort_keys=False))
        return subprocess.run(
            [sys.executable, "-m", "sluicegate", "check-config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "200"},
        )

    refused = check({"path": str(tmp_path / "b.db")})
    accepted = check({})
    assert refused.returncode == 1, refused
    assert "batches.path" in refused.stderr, refused.stderr
    assert accepted.returncode == 0, accepted
