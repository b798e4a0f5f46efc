"""Watching a batch with a progress bar, and downloading its output and error files."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from sluicegate.clients.batch_http import (
    BatchClient,
    BatchCliError,
    GatewayRefusedError,
    checked_id,
)

ENDED = ("completed", "failed", "expired", "cancelled")
"""The statuses a batch never leaves."""
PATIENCE_S = 30.0
"""How long a watch rides out an unreachable or overloaded gateway before giving up."""


class LinesPerSecond(ProgressColumn):
    """How fast the batch's lines finish, as rich estimates it from recent polls."""

    def render(self, task: Task) -> Text:
        """``12.3 lines/s``, or ``– lines/s`` before two polls have shown progress."""
        speed = task.finished_speed or task.speed
        shown = "–" if speed is None else f"{speed:.1f}"
        return Text(f"{shown} lines/s", style="progress.data.speed")


def done_of(batch: dict[str, Any]) -> tuple[int, int]:
    """Lines finished (completed + failed) and lines in all, from a batch object."""
    counts = batch.get("request_counts") or {}
    done = int(counts.get("completed", 0)) + int(counts.get("failed", 0))
    return done, int(counts.get("total", 0))


async def _poll(
    client: BatchClient, batch_id: str, interval_s: float, patience_s: float
) -> dict[str, Any]:
    """The batch now; a gateway that does not answer, or answers 429/5xx, is asked again
    every ``interval_s`` for up to ``patience_s``."""
    give_up = time.monotonic() + patience_s
    while True:
        try:
            return await client.batch(batch_id)
        except GatewayRefusedError as exc:
            if not exc.transient or time.monotonic() > give_up:
                raise
        except BatchCliError:
            if time.monotonic() > give_up:
                raise
        await asyncio.sleep(interval_s)


async def watch_batch(
    client: BatchClient, batch_id: str, interval_s: float, console: Console
) -> dict[str, Any]:
    """Poll the batch every ``interval_s`` under a progress bar (finished of total, rate,
    status) until it ends; the batch object it ended with. Once the first poll has
    answered, an unreachable or overloaded gateway is ridden out for ``PATIENCE_S``."""
    columns = (
        TextColumn("{task.description:<11}"),
        BarColumn(bar_width=30),
        MofNCompleteColumn(),
        LinesPerSecond(),
        TimeElapsedColumn(),
    )
    # A first poll that fails is most likely a wrong --url or id: say so at once.
    batch = await _poll(client, batch_id, interval_s, patience_s=0.0)
    console.print(f"watching {batch_id} (Ctrl-C stops watching, not the batch)", highlight=False)
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(str(batch.get("status")), total=None)
        while True:
            done, total = done_of(batch)
            status = str(batch.get("status"))
            progress.update(task, description=status, completed=done, total=total or None)
            if status in ENDED:
                return batch
            await asyncio.sleep(interval_s)
            batch = await _poll(client, batch_id, interval_s, PATIENCE_S)


@dataclass(frozen=True)
class Downloaded:
    """One file of a batch written to disk."""

    kind: str
    path: Path
    lines: int


def confined(out_dir: Path, name: str) -> Path:
    """``out_dir / name``, once it is certain to stay in ``out_dir`` (resolved, symlinks
    followed); a ``BatchCliError`` otherwise."""
    base = out_dir.resolve()
    path = (base / name).resolve()
    if path.parent != base or not path.is_relative_to(base):
        raise BatchCliError(f"{name}: would be written outside --output {out_dir}")
    return path


async def download_files(
    client: BatchClient, batch: dict[str, Any], out_dir: Path, asked: str | None = None
) -> list[Downloaded]:
    """Write the batch's output and error files that exist as ``<id>_output.jsonl`` and
    ``<id>_errors.jsonl`` in ``out_dir``; an error if the batch has not ended yet.

    The gateway's ids are checked before they name a file or a URL: a batch id that is
    not ``batch_…`` (or not the ``asked`` one), or a file id that is not ``file-…``,
    is an error and nothing is written; every file stays inside ``out_dir``."""
    batch_id = checked_id("batch", batch.get("id"), source="the gateway answered a batch id")
    if asked is not None and batch_id != asked:
        raise BatchCliError(f"asked for batch {asked}, the gateway answered {batch_id}")
    status = str(batch.get("status"))
    if status not in ENDED:
        raise BatchCliError(
            f"batch {batch_id} is {status}: its files are written when it ends"
            f" (sluicegate batch watch {batch_id})"
        )
    files = [
        (kind, field, batch.get(field))
        for kind, field in (("output", "output_file_id"), ("errors", "error_file_id"))
    ]
    wanted = [
        (kind, checked_id("file", file_id, source=f"the gateway answered {field}"))
        for kind, field, file_id in files
        if file_id
    ]
    if wanted:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BatchCliError(f"--output {out_dir}: {exc.strerror or exc}") from None
    written: list[Downloaded] = []
    for kind, file_id in wanted:
        path = out_dir / f"{batch_id}_{kind}.jsonl"
        try:
            for name in (path.name, path.name + ".part"):
                confined(out_dir, name)
            lines = await client.download(file_id, path)
        except OSError as exc:
            raise BatchCliError(f"{path}: {exc.strerror or exc}") from None
        written.append(Downloaded(kind, path, lines))
    return written


def ending(batch: dict[str, Any]) -> str:
    """One line saying how a batch ended (or where it is): status and counts, and for a
    failed batch why."""
    counts = batch.get("request_counts") or {}
    line = (
        f"batch {batch.get('id')} {batch.get('status')}: {counts.get('completed', 0)} completed,"
        f" {counts.get('failed', 0)} failed of {counts.get('total', 0)}"
    )
    errors = (batch.get("errors") or {}).get("data") or []
    reasons = [str(e.get("message")) for e in errors[:3] if isinstance(e, dict)]
    if reasons:
        line += " — " + "; ".join(reasons)
    return line
