"""``sluicegate batch`` against a hostile gateway: a real Starlette server on loopback that
answers the Files and Batches APIs with ids made to escape the output directory.

The CLI runs as a subprocess (as in ``tests/test_batch_cli.py``); whatever the server
answers, nothing is written outside ``--output`` and the command exits 2 saying which id
it refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.gateway.gateway_harness import serve_in_thread
from tests.test_batch_cli import chat_line, cli, write_lines

GOOD_BATCH = "batch_0123abcd"
GOOD_FILE = "file-0123abcd"
CONTENT = b'{"custom_id": "r0"}\n'


@dataclass
class Hostile:
    """What the server answers as ids, and the paths it was asked for."""

    batch_id: str = GOOD_BATCH
    file_id: str = GOOD_FILE
    paths: list[str] = field(default_factory=list)


def hostile_app(ids: Hostile) -> Starlette:
    """Answers every Files and Batches call with ``ids``; the batch has always completed."""

    def batch() -> Response:
        body = {
            "id": ids.batch_id,
            "object": "batch",
            "status": "completed",
            "endpoint": "/v1/chat/completions",
            "output_file_id": ids.file_id,
            "error_file_id": None,
            "request_counts": {"total": 1, "completed": 1, "failed": 0},
            "created_at": 0,
        }
        return Response(orjson.dumps(body), media_type="application/json")

    async def any_call(request: Request) -> Response:
        ids.paths.append(request.url.path)
        await request.body()
        if request.url.path == "/v1/files":
            body = {"id": ids.file_id, "object": "file", "bytes": 20, "purpose": "batch"}
            return Response(orjson.dumps(body), media_type="application/json")
        if request.url.path.endswith("/content"):
            return Response(CONTENT, media_type="application/jsonl")
        return batch()

    return Starlette(routes=[Route("/{rest:path}", any_call, methods=["GET", "POST"])])


@pytest.fixture
def hostile() -> Iterator[tuple[str, Hostile]]:
    """The hostile server's URL and the ids it answers (a test sets them)."""
    ids = Hostile()
    with serve_in_thread(hostile_app(ids)) as port:
        yield f"http://127.0.0.1:{port}", ids


def files_under(root: Path) -> list[str]:
    """Every file below ``root``, relative to it."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


ESCAPES = [
    "../escaped",
    "batch_../../escaped",
    "batch_x/../../escaped",
    "<absolute>",
    "batch_a\x00b",
    "batch_" + "a" * 65,
]


@pytest.mark.parametrize("bad", ESCAPES, ids=range(len(ESCAPES)))
def test_download_refuses_a_batch_id_that_would_leave_the_output_dir(
    hostile: tuple[str, Hostile], tmp_path: Path, bad: str
) -> None:
    """The gateway answers GET /v1/batches/batch_… with an id holding ``../`` (or an
    absolute path, a NUL, 65 characters): exit 2 naming the refused id; nothing written
    anywhere, in or out of --output, and no file content asked for."""
    url, ids = hostile
    ids.batch_id = str(tmp_path / "escaped") if bad == "<absolute>" else bad
    out = tmp_path / "a" / "b" / "out"
    result = cli(["download", GOOD_BATCH, "--url", url, "--output", str(out)], cwd=tmp_path)
    assert result.returncode == 2, result
    assert "error: the gateway answered a batch id" in result.stderr, result.stderr
    assert "is not a batch id" in result.stderr, result.stderr
    assert files_under(tmp_path) == [], files_under(tmp_path)
    assert not any(p.endswith("/content") for p in ids.paths), ids.paths


def test_submit_watch_refuses_an_escaping_batch_id_before_any_poll(
    hostile: tuple[str, Hostile], tmp_path: Path
) -> None:
    """submit --watch: the created batch's id is ``../../escaped``: exit 2 before it is
    polled or downloaded, and no file appears outside the input file."""
    url, ids = hostile
    ids.batch_id = "../../escaped"
    source = write_lines(tmp_path / "in.jsonl", [chat_line("r0")])
    out = tmp_path / "x" / "out"
    result = cli(["submit", str(source), "--url", url, "--watch", "--output", str(out),
                  "--interval", "0.1"], cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2, result
    assert "the gateway answered a batch id '../../escaped' is not a batch id" in result.stderr
    assert files_under(tmp_path) == ["in.jsonl"]
    assert ids.paths == ["/v1/files", "/v1/batches"]


@pytest.mark.parametrize("bad", ["../../../escaped", "file-a/b", "file-..%2f"])
def test_a_file_id_that_is_not_a_file_id_is_refused(
    hostile: tuple[str, Hostile], tmp_path: Path, bad: str
) -> None:
    """A good batch whose output_file_id is not ``file-…``: exit 2 naming the field,
    nothing fetched or written."""
    url, ids = hostile
    ids.file_id = bad
    out = tmp_path / "out"
    result = cli(["download", GOOD_BATCH, "--url", url, "--output", str(out)])
    assert result.returncode == 2, result
    assert "the gateway answered output_file_id" in result.stderr, result.stderr
    assert files_under(tmp_path) == []
    assert not any(p.endswith("/content") for p in ids.paths), ids.paths


def test_another_batch_than_the_one_asked_is_refused(
    hostile: tuple[str, Hostile], tmp_path: Path
) -> None:
    """The gateway answers a well-formed id, but not the one asked for: exit 2, no file."""
    url, ids = hostile
    ids.batch_id = "batch_other"
    result = cli(["download", GOOD_BATCH, "--url", url, "--output", str(tmp_path)])
    assert result.returncode == 2, result
    assert f"asked for batch {GOOD_BATCH}, the gateway answered batch_other" in result.stderr
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("command", ["download", "watch", "cancel"])
def test_a_batch_id_argument_of_the_wrong_shape_is_a_usage_error(
    hostile: tuple[str, Hostile], tmp_path: Path, command: str
) -> None:
    """BATCH_ID ``../x`` is refused before any request (exit 2)."""
    url, ids = hostile
    result = cli([command, "../x", "--url", url], cwd=tmp_path)
    assert result.returncode == 2, result
    assert result.stderr.strip() == (
        "error: BATCH_ID '../x' is not a batch id (batch_ then up to 64 letters, digits, _ or -)"
    )
    assert ids.paths == []
    assert files_under(tmp_path) == []


def test_a_symlink_at_the_output_name_is_not_followed_out(
    hostile: tuple[str, Hostile], tmp_path: Path
) -> None:
    """A symlink already at ``<id>_output.jsonl`` pointing outside --output: refused, and
    the file it points to is untouched; a well-behaved download still works next to it."""
    url, _ = hostile
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (out / f"{GOOD_BATCH}_output.jsonl").symlink_to(victim)
    result = cli(["download", GOOD_BATCH, "--url", url, "--output", str(out)])
    assert result.returncode == 2, result
    assert "would be written outside --output" in result.stderr, result.stderr
    assert victim.read_text() == "keep"
    os.unlink(out / f"{GOOD_BATCH}_output.jsonl")
    result = cli(["download", GOOD_BATCH, "--url", url, "--output", str(out)])
    assert result.returncode == 0, result
    assert (out / f"{GOOD_BATCH}_output.jsonl").read_bytes() == CONTENT
