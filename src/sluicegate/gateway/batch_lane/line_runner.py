"""The batch runner: runs the lines of every batch in its lane, on capacity left idle.

Each gateway process runs one. Every tick it records the lines that ended
(one transaction for all of them), and claims new ones, for each model as many
as its window has room for (``batches.max_inflight``, default the model's
``max_concurrency``). Each claimed line is served by ``serve_ticket``, the path of
every HTTP request, as a ticket of its batch's tenant, in its batch's lane, at
``batches.priority`` (``line_dispatch.py``), so it waits behind every other lane,
borrows only idle capacity, is preempted first, and counts against its tenant's
limits.

Every ``poll_interval_s`` it also checks new batches, ends those that are done,
expired or cancelled (``batches/sqlite/finishing.py``), stops its lines of batches that
ended, and renews the leases of the lines it runs.

A batch whose tenant the gateway no longer knows (its key left the config) is
stopped, never run under another tenant's limits: its unfinished lines become
``tenant_removed`` error lines and it ends ``cancelled`` (DESIGN §20).

What a line's outcome (``Served``) means: ``Completed`` and ``ok``, an output line;
``Preempted``, or ``Rejected`` for now (by the scheduler or the engine's 429), the line
waits (the rejection's ``retry_after_s``) and runs again, costing no attempt; a
``transient`` failure (an engine's or the gateway's, 5xx), another attempt after a
backoff, an error line after ``max_attempts``; any other answer or failure, an error
line holding it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, assert_never

import orjson

from sluicegate.batches.batch_backend import BatchBackend, Claim, Result, Retry
from sluicegate.batches.batches_config import BatchesSpec
from sluicegate.batches.lines import LineError, LineRequest, read_line
from sluicegate.batches.objects import error_line, new_id, output_line
from sluicegate.gateway.batch_lane.batch_metrics import BatchProgress
from sluicegate.gateway.batch_lane.line_dispatch import LineCall
from sluicegate.gateway.http_errors import GatewayError, error_body
from sluicegate.gateway.request.serving import (
    Completed,
    Failed,
    Left,
    Preempted,
    Rejected,
    Served,
    Serving,
    Streamed,
    TicketRequest,
)
from sluicegate.gateway.state import GatewayState
from sluicegate.store.store_errors import StorageError, storage_error

log = logging.getLogger("sluicegate.batches")
RETRY_LATER_S = 1.0
"""How long a preempted line waits before it runs again."""
MAX_BACKOFF_S = 60.0
TENANT_REMOVED = "tenant_removed"
TENANT_REMOVED_MESSAGE = "The batch's tenant is no longer configured on the gateway."


@dataclass(slots=True)
class _Running:
    claim: Claim
    call: LineCall
    task: asyncio.Task[None]


class BatchRunner:
    """Claims, runs and records the batch lines of one gateway process."""

    def __init__(
        self,
        state: GatewayState,
        spec: BatchesSpec,
        backend: BatchBackend,
        servers: Mapping[str, Serving],
        progress: BatchProgress,
    ) -> None:
        self.state = state
        self.spec = spec
        self.backend = backend
        self.progress = progress
        self._servers = servers
        self.owner = f"{socket.gethostname()}-{os.getpid()}-{new_id('')[:8]}"
        self._windows = {
            model.name: self.spec.max_inflight or model.max_concurrency
            for model in state.config.models
        }
        self._running: dict[tuple[str, int], _Running] = {}
        self._held: dict[str, list[float]] = {model: [] for model in self._windows}
        self._results: list[Result] = []
        self._retries: list[Retry] = []
        self._routes: dict[str, tuple[str, str, str]] = {}
        self._wake = asyncio.Event()
        self._next_chores = 0.0
        # Whom a request can belong to now: a batch of anyone else is stopped, not run.
        self._tenants = state.keys.tenants() if state.auth_required else {state.anonymous_tenant}
        self.storage_failure: StorageError | None = None
        """The storage failure the last tick met; None while ticks succeed."""
        self._failing_since = 0.0

    def check_line(self, endpoint: str, lane: str, text: bytes) -> LineRequest | LineError:
        """Check one input line of a batch for ``endpoint`` running in ``lane``."""

        def problem(model_name: str) -> str | None:
            model = self.state.models.get(model_name)
            if model is None:
                return f"model {model_name!r} does not exist"
            if all(spec.name != lane for spec in model.lanes):
                return f"model {model_name!r} has no lane {lane!r}"
            return None

        return read_line(text, endpoint, problem, self.spec.max_line_bytes)

    async def run(self) -> None:
        """Tick until cancelled; a failing tick is retried every ``poll_interval_s``.

        A storage failure (a full disk, Redis out of memory or unreachable) is logged once
        when it starts, once if it changes (full ↔ unavailable) and once when a tick
        succeeds again, with its reason only (never a traceback: redis-py's messages may
        hold lines). Results of lines that ended meanwhile stay in memory and are
        recorded once the storage takes them. Any other exception is a bug: logged each time.
        """
        while True:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failure = storage_error(exc)
                if failure is None:
                    log.exception("batch runner tick failed; retrying")
                else:
                    self._storage_failed(failure)
                await asyncio.sleep(self.spec.poll_interval_s)
            else:
                self._storage_ok()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.spec.poll_interval_s)
            self._wake.clear()

    def _storage_failed(self, failure: StorageError) -> None:
        self.progress.storage_error("runner", failure)
        if self.storage_failure is not None and self.storage_failure.full == failure.full:
            return
        if self.storage_failure is None:
            self._failing_since = time.monotonic()
        self.storage_failure = failure
        self.progress.storage = "full" if failure.full else "unavailable"
        log.warning(
            "batch storage %s (%s): batches wait; the runner retries every %.1f s",
            "full" if failure.full else "unavailable",
            failure.reason,
            self.spec.poll_interval_s,
        )

    def _storage_ok(self) -> None:
        if self.storage_failure is None:
            return
        self.storage_failure = None
        self.progress.storage = "ok"
        failed_s = time.monotonic() - self._failing_since
        log.warning("batch storage recovered after %.1f s: batches go on", failed_s)

    async def _tick(self) -> None:
        now = time.time()
        if now >= self._next_chores:
            self._next_chores = now + self.spec.poll_interval_s
            await self._chores(now)
        await self._flush()
        if self.state.scheduler.draining:
            return
        now = time.time()
        for model, window in self._windows.items():
            held = self._held[model]
            held[:] = [until for until in held if until > now]
            running = sum(1 for r in self._running.values() if r.claim.model == model)
            free = window - running - len(held)
            if free <= 0:
                continue
            claims = await self.backend.claim(model, self.owner, free, now, self.spec.lease_s)
            for claim in claims:
                await self._start(claim)

    async def _chores(self, now: float) -> None:
        backend = self.backend
        changed = await backend.validate_pending(self.check_line, int(now))
        for batch_id, tenant in await backend.active_batches():
            if tenant not in self._tenants and await backend.stop_batch(
                batch_id, TENANT_REMOVED, TENANT_REMOVED_MESSAGE, int(now)
            ):
                log.warning("batch %s stopped: its tenant is no longer configured", batch_id)
        changed += await backend.finish_due(int(now))
        for batch_id, status in changed:
            log.info("batch %s is %s", batch_id, status)
            if status != "in_progress":
                self._routes.pop(batch_id, None)
        if self._running:
            ids = sorted({key[0] for key in self._running})
            statuses = await backend.statuses(ids)
            for key, running in list(self._running.items()):
                if statuses.get(key[0]) != "in_progress":
                    running.call.stop()
            claims = [running.claim for running in self._running.values()]
            await backend.renew(self.owner, claims, now + self.spec.lease_s)
        self.progress.update(*await backend.progress())

    async def _start(self, claim: Claim) -> None:
        route = self._routes.get(claim.batch_id)
        if route is None:
            route = await self.backend.batch_route(claim.batch_id)
            if route is None:
                return
            self._routes[claim.batch_id] = route
        tenant, lane, endpoint = route
        if tenant not in self._tenants:
            text = error_line(claim.custom_id, TENANT_REMOVED, TENANT_REMOVED_MESSAGE)
            self._results.append(Result(claim.batch_id, claim.idx, False, text))
            return
        serving = self._servers[endpoint]
        call = LineCall(new_id("req_"))
        task = asyncio.create_task(self._serve(claim, call, serving, tenant, lane))
        self._running[(claim.batch_id, claim.idx)] = _Running(claim, call, task)

    async def _serve(
        self, claim: Claim, call: LineCall, serving: Serving, tenant: str, lane: str
    ) -> None:
        """Serve the line as a ticket of ``tenant`` in ``lane`` at ``batches.priority``."""
        priority = str(self.spec.priority)
        request = TicketRequest(tenant, self.state.driver.now(), lane=lane, priority=priority)
        served: Served | None
        try:
            served = await call.run(serving, request, claim.body)
        except Exception:
            log.exception("batch %s line %d failed in the gateway", claim.batch_id, claim.idx)
            served = Failed(GatewayError(500, "internal_error", "the gateway failed the line"))
        finally:
            self._running.pop((claim.batch_id, claim.idx), None)
            self._wake.set()
        if served is not None:
            self._judge(claim, call.request_id, served)

    def _judge(self, claim: Claim, request_id: str, served: Served) -> None:
        """What the outcome means for the line: a result, or another try later."""
        now, model = time.time(), claim.model
        match served:
            case Preempted():
                if self.spec.yield_hold_s > 0:
                    # Without the hold, the line claimed into the preempted one's place takes
                    # the slot back as soon as an interactive request ends, and the next
                    # arrival must preempt again: every arrival pays an abort and the engine
                    # keeps a full batch beside it (benchmarks/bench_batch_yield.py).
                    self._held[model].append(now + self.spec.yield_hold_s)
                self._retries.append(Retry(claim, now + RETRY_LATER_S, failed=False))
                self.progress.ended(model, "preempted")
            case Rejected(retry_after_s=wait):
                self._retries.append(Retry(claim, now + wait, failed=False))
                self.progress.ended(model, "deferred")
            case Completed() | Failed() if (
                served.transient and claim.attempts + 1 < self.spec.max_attempts
            ):
                backoff = min(MAX_BACKOFF_S, 2.0**claim.attempts)
                self._retries.append(Retry(claim, now + backoff, failed=True))
                self.progress.ended(model, "retried")
            case Completed(status=status, body=body):
                self._record(claim, request_id, status, body, ok=served.ok)
            case Failed(error=error):
                # The line's output holds the error as an HTTP client would have read it.
                body = error_body(error.status, error.code, error.message, error.param)
                self._record(claim, request_id, error.status, body, ok=False)
            case Left() | Streamed():
                pass  # nothing was answered (and a line never streams)
            case _:
                assert_never(served)

    def _record(
        self, claim: Claim, request_id: str, status: int, answer: bytes, *, ok: bool
    ) -> None:
        """The line's result: an output line (``ok``) or an error line holding the answer."""
        body = _parsed(answer)
        text = output_line(claim.custom_id, status, request_id, body)
        prompt, completion = _usage(body) if ok else (0, 0)
        self._results.append(Result(claim.batch_id, claim.idx, ok, text, prompt, completion))
        self.progress.ended(claim.model, "completed" if ok else "failed")

    async def _flush(self) -> None:
        if not self._results and not self._retries:
            return
        results, retries = self._results, self._retries
        self._results, self._retries = [], []
        try:
            await self.backend.record(results, retries, self.owner)
        except BaseException:
            self._results[:0], self._retries[:0] = results, retries
            raise

    async def close(self) -> None:
        """Stop every line this process runs and hand it back (it runs again at once, here
        or in another process), then record what ended. A storage that fails then is
        logged, not raised: the gateway goes on shutting down, and the lines run again
        once their lease ends."""
        running = list(self._running.values())
        for one in running:
            one.call.stop()
        if running:
            await asyncio.gather(*(one.task for one in running), return_exceptions=True)
        now = time.time()
        for one in running:
            self._retries.append(Retry(one.claim, now, failed=False))
        results, retries = len(self._results), len(self._retries)
        try:
            await self._flush()
        except Exception as exc:
            failure = storage_error(exc)
            if failure is None:
                raise
            log.warning(
                "batch storage %s at shutdown (%s): %d results and %d lines handed back are"
                " lost; those lines run again once their lease ends",
                "full" if failure.full else "unavailable",
                failure.reason,
                results,
                retries,
            )


def _parsed(body: bytes) -> Any:
    """An answer's JSON, or its text when it is not JSON (the file line still carries it)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")


def _usage(body: Any) -> tuple[int, int]:
    """(prompt, completion) tokens of an engine's parsed answer; zeros if it reported none."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0
    try:
        return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    except (TypeError, ValueError):
        return 0, 0
