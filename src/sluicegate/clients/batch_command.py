"""``sluicegate batch``: submit a JSONL file to a gateway's Batch API, watch it, fetch results.

Exit codes: 0 done (a watched batch ``completed``); 1 a watched batch ended
``failed``, ``expired`` or ``cancelled``; 2 a usage error, the gateway
unreachable, or an error it answered (printed as its OpenAI message and code).
The API key is read from an environment variable and never printed.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from sluicegate.clients.batch_http import BatchClient

T = TypeVar("T")
EXIT_ENDED_BADLY = 1
EXIT_ERROR = 2
DEFAULT_ENDPOINT = "/v1/chat/completions"
PIPED_WIDTH = 160
"""Columns of a table written to a pipe or file (not cut to a terminal's 80)."""

batch_app = typer.Typer(
    help="Run a JSONL file of requests through a gateway's Batch API (OpenAI Files + Batches).",
    no_args_is_help=True,
)
# Messages are never folded at 80 columns when piped: a log keeps each on one line.
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

Url = Annotated[str, typer.Option("--url", help="the gateway's base URL, e.g. http://host:8080")]
KeyEnv = Annotated[
    str,
    typer.Option(help="environment variable holding the API key (the key is never printed)"),
]
Interval = Annotated[float, typer.Option(help="seconds between polls", min=0.05)]
OutputDir = Annotated[Path, typer.Option("--output", help="directory to write the files to")]


def parse_metadata(pairs: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings as a metadata mapping (a value may contain ``=``)."""
    metadata: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--metadata expects KEY=VALUE, got {pair!r}")
        metadata[key] = value
    return metadata


def first_line_endpoint(path: Path) -> str | None:
    """The ``url`` of the file's first non-blank line, when it is a JSON object with one."""
    with path.open("rb") as stream:
        for raw in stream:
            if raw.strip():
                try:
                    line: Any = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    return None
                url = line.get("url") if isinstance(line, dict) else None
                return url if isinstance(url, str) else None
    return None


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error: {escape(message)}[/red]")
    return typer.Exit(EXIT_ERROR)


def _batch_id(value: str) -> str:
    """The BATCH_ID argument, once it has OpenAI's shape (it names files and URLs)."""
    from sluicegate.clients.batch_http import BatchCliError, checked_id

    try:
        return checked_id("batch", value, source="BATCH_ID")
    except BatchCliError as exc:
        raise _fail(str(exc)) from None


def _client(url: str, key_env: str) -> BatchClient:
    from sluicegate.clients.batch_http import BatchClient, BatchCliError, api_key

    try:
        return BatchClient(url, api_key(key_env))
    except BatchCliError as exc:
        raise _fail(str(exc)) from None


def _run(coroutine: Coroutine[Any, Any, T], key_env: str) -> T:
    """Run one command's requests; a ``BatchCliError`` is printed and exits 2 (a 401 says
    when the key's variable is unset)."""
    from sluicegate.clients.batch_http import BatchCliError, GatewayRefusedError, api_key

    try:
        return asyncio.run(coroutine)
    except BatchCliError as exc:
        message = str(exc)
        if isinstance(exc, GatewayRefusedError) and exc.status == 401 and api_key(key_env) is None:
            message += f"; the variable {key_env} that holds the API key is not set"
        raise _fail(message) from None
    except KeyboardInterrupt:
        err.print("stopped; the batch goes on in the gateway")
        raise typer.Exit(130) from None


def _call(url: str, key_env: str, work: Callable[[BatchClient], Awaitable[T]]) -> T:
    """Open a client of the gateway at ``url`` (its key from ``key_env``), run ``work`` with
    it and close it, as ``_run`` runs a command's requests."""
    client = _client(url, key_env)

    async def run() -> T:
        async with client:
            return await work(client)

    return _run(run(), key_env)


def _finish(batch: dict[str, Any], downloaded: list[Any] | None) -> None:
    """Print how a watched batch ended (and the files written); exit 1 unless completed."""
    from sluicegate.clients.batch_watch import ending

    for one in downloaded or ():
        console.print(f"{one.kind}: {escape(str(one.path))} ({one.lines} lines)")
    if batch.get("status") == "completed":
        console.print(escape(ending(batch)))
        return
    err.print(f"[red]{escape(ending(batch))}[/red]")
    raise typer.Exit(EXIT_ENDED_BADLY)


@batch_app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="JSONL file: one request per line")],
    url: Url,
    endpoint: Annotated[
        str | None,
        typer.Option(help=f"default: the first line's url, else {DEFAULT_ENDPOINT}"),
    ] = None,
    window: Annotated[str, typer.Option(help="completion window, e.g. 24h")] = "24h",
    lane: Annotated[
        str | None, typer.Option(help="gateway lane to run in (default: batches.lane)")
    ] = None,
    metadata: Annotated[
        list[str] | None, typer.Option(help="KEY=VALUE kept with the batch (repeat)")
    ] = None,
    watch: Annotated[bool, typer.Option(help="then watch it and download its files")] = False,
    output: Annotated[
        Path | None, typer.Option(help="with --watch: where to write the files (default .)")
    ] = None,
    interval: Interval = 1.0,
    api_key_env: KeyEnv = "OPENAI_API_KEY",
) -> None:
    """Upload FILE and create a batch of it; print the batch id (alone on stdout)."""
    if output is not None and not watch:
        raise _fail("--output needs --watch (or use: sluicegate batch download)")
    if not file.is_file():
        raise _fail(f"{file}: no such file" if not file.exists() else f"{file}: not a file")
    try:
        pairs = parse_metadata(metadata or [])
        chosen = endpoint or first_line_endpoint(file) or DEFAULT_ENDPOINT
    except (ValueError, OSError) as exc:
        raise _fail(str(exc)) from None

    async def run(client: BatchClient) -> tuple[dict[str, Any], list[Any] | None]:
        from sluicegate.clients.batch_http import checked_id
        from sluicegate.clients.batch_watch import download_files, watch_batch

        uploaded = await client.upload(file)
        answered = "the gateway answered a {} id"
        file_id = checked_id("file", uploaded.get("id"), source=answered.format("file"))
        err.print(f"uploaded {escape(file.name)} as {file_id} ({uploaded.get('bytes')} bytes)")
        batch = await client.create(file_id, chosen, window, lane=lane, metadata=pairs)
        batch_id = checked_id("batch", batch.get("id"), source=answered.format("batch"))
        console.print(batch_id, highlight=False)
        if not watch:
            return batch, None
        ended = await watch_batch(client, batch_id, interval, err)
        return ended, await download_files(client, ended, output or Path("."), batch_id)

    batch, downloaded = _call(url, api_key_env, run)
    if watch:
        _finish(batch, downloaded)


@batch_app.command("watch")
def watch_command(
    batch_id: Annotated[str, typer.Argument(help="the batch's id (batch_…)")],
    url: Url,
    interval: Interval = 1.0,
    api_key_env: KeyEnv = "OPENAI_API_KEY",
) -> None:
    """Show a progress bar until the batch ends: exit 0 completed, 1 failed/expired/cancelled."""
    from sluicegate.clients.batch_watch import watch_batch

    batch_id = _batch_id(batch_id)
    _finish(
        _call(url, api_key_env, lambda client: watch_batch(client, batch_id, interval, err)), None
    )


@batch_app.command()
def download(
    batch_id: Annotated[str, typer.Argument(help="the batch's id (batch_…)")],
    url: Url,
    output: OutputDir = Path("."),
    api_key_env: KeyEnv = "OPENAI_API_KEY",
) -> None:
    """Write an ended batch's <id>_output.jsonl and <id>_errors.jsonl; print their lines."""
    batch_id = _batch_id(batch_id)

    async def run(client: BatchClient) -> tuple[dict[str, Any], list[Any]]:
        from sluicegate.clients.batch_watch import download_files

        batch = await client.batch(batch_id)
        return batch, await download_files(client, batch, output, batch_id)

    batch, downloaded = _call(url, api_key_env, run)
    for one in downloaded:
        console.print(f"{one.kind}: {escape(str(one.path))} ({one.lines} lines)")
    if not downloaded:
        console.print(f"batch {escape(batch_id)} ({batch.get('status')}) has no files")


@batch_app.command("list")
def list_command(
    url: Url,
    limit: Annotated[int, typer.Option(help="how many, newest first", min=1, max=100)] = 20,
    api_key_env: KeyEnv = "OPENAI_API_KEY",
) -> None:
    """The newest batches of the key's tenant, as a table."""
    listing = _call(url, api_key_env, lambda client: client.batches(limit))
    table = Table("id", "status", "endpoint", "done", "failed", "total", "created (UTC)")
    for batch in listing.get("data") or []:
        counts = batch.get("request_counts") or {}
        completed, failed = int(counts.get("completed", 0)), int(counts.get("failed", 0))
        created = datetime.fromtimestamp(int(batch.get("created_at", 0)), tz=UTC)
        table.add_row(
            escape(str(batch.get("id"))),
            escape(str(batch.get("status"))),
            escape(str(batch.get("endpoint"))),
            str(completed + failed),
            str(failed),
            str(counts.get("total", 0)),
            created.strftime("%Y-%m-%d %H:%M:%S"),
        )
    out = console if sys.stdout.isatty() else Console(width=PIPED_WIDTH)
    out.print(table)
    if listing.get("has_more"):
        out.print(f"(more: raise --limit, up to 100; showing {len(listing.get('data') or [])})")


@batch_app.command()
def cancel(
    batch_id: Annotated[str, typer.Argument(help="the batch's id (batch_…)")],
    url: Url,
    api_key_env: KeyEnv = "OPENAI_API_KEY",
) -> None:
    """Ask the gateway to stop a batch: its unfinished lines become error lines."""
    batch_id = _batch_id(batch_id)
    batch = _call(url, api_key_env, lambda client: client.cancel(batch_id))
    console.print(f"batch {escape(str(batch.get('id')))}: {escape(str(batch.get('status')))}")
