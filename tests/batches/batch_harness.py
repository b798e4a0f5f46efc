"""Helpers for the Files and Batches API tests: a gateway with ``batches:`` on loopback,
two tenants, JSONL lines, the official ``openai`` SDK as client, and a tiny embeddings engine.

Every gateway here is real (uvicorn on an OS-chosen port in a thread, ``gateway_harness``)
in front of an emulated engine; batch state lives in a SQLite file under the test's
``tmp_path``.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import orjson
from openai.types import Batch, FileObject

from sluicegate.engine import EngineConfig
from tests.gateway.gateway_harness import (
    MODEL,
    Reply,
    Stack,
    openai_error,
    stack,
)

KEY_A = "sk-batch-tenant-a-canary"
KEY_B = "sk-batch-tenant-b-canary"
ENVIRON = {"KEY_A": KEY_A, "KEY_B": KEY_B}
TENANTS = """tenants:
  - {name: a, api_key_env: KEY_A}
  - {name: b, api_key_env: KEY_B}
"""
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
TERMINAL = ("completed", "failed", "expired", "cancelled")


def batches_section(path: Path, settings: str = "") -> str:
    """A ``batches:`` section with its database at ``path`` and a fast runner poll, plus
    ``settings`` (lines indented by two spaces, e.g. ``"  max_lines: 10\\n"``)."""
    return f"batches:\n  path: {path}\n  poll_interval_s: 0.1\n{settings}"


def distributed_section(store: str, batches: str = "", tenants: str = TENANTS) -> str:
    """Top-level YAML of a distributed gateway (replica ``gw``, local limits while the store
    fails) whose batch lane keeps its state in ``store`` (no ``batches.path``), with
    ``tenants`` and a fast runner poll, plus ``batches`` keys (indented by two spaces)."""
    return (
        tenants + f"store: {store}\n"
        "distributed: {replica_id: gw, on_store_failure: fail_open, timeout_ms: 250}\n"
        f"batches:\n  poll_interval_s: 0.1\n{batches}"
    )


@contextmanager
def batch_stack(
    tmp_path: Path,
    *,
    model: str = "",
    tenants: str = TENANTS,
    settings: str = "",
    engine: EngineConfig | None = None,
    environ: Mapping[str, str] = ENVIRON,
) -> Iterator[Stack]:
    """An emulated engine and a gateway with the batch lane on (database in ``tmp_path``).

    ``model`` is YAML under the ``tiny`` model (and may add models); ``tenants`` the
    top-level ``tenants:`` section; ``settings`` extra ``batches:`` keys.
    """
    body = model + tenants + batches_section(tmp_path / "batches.db", settings)
    with stack(body, environ=environ, engine=engine) as live:
        yield live


def client(live: Stack, key: str = KEY_A) -> openai.OpenAI:
    """The official SDK pointed at the gateway with a tenant key; it never retries, so each
    call is exactly one request."""
    return openai.OpenAI(base_url=live.base_url + "/v1", api_key=key, max_retries=0, timeout=60)


def chat_line(
    custom_id: str, text: str = "hello", max_tokens: int = 6, **body: Any
) -> dict[str, Any]:
    """A chat line that generates exactly ``max_tokens`` tokens (``ignore_eos``)."""
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {
            "model": MODEL,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            **body,
        },
    }


def completion_line(custom_id: str, text: str = "hello", max_tokens: int = 6) -> dict[str, Any]:
    """A completions line that generates exactly ``max_tokens`` tokens (``ignore_eos``)."""
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": COMPLETIONS,
        "body": {"model": MODEL, "prompt": text, "max_tokens": max_tokens, "ignore_eos": True},
    }


def embedding_line(custom_id: str, text: str = "hello") -> dict[str, Any]:
    """An embeddings line."""
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": EMBEDDINGS,
        "body": {"model": MODEL, "input": text},
    }


def jsonl(lines: Sequence[dict[str, Any] | str | bytes]) -> bytes:
    """A JSONL file: dicts serialised, strings and bytes as they are, one per line."""
    out = []
    for line in lines:
        if isinstance(line, dict):
            out.append(orjson.dumps(line))
        elif isinstance(line, str):
            out.append(line.encode())
        else:
            out.append(line)
    return b"\n".join(out) + b"\n"


def upload(sdk: openai.OpenAI, lines: Sequence[dict[str, Any] | str | bytes]) -> FileObject:
    """Upload ``lines`` as a batch input file with the SDK."""
    return sdk.files.create(file=("input.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")


def start_batch(
    sdk: openai.OpenAI,
    lines: Sequence[dict[str, Any] | str | bytes],
    endpoint: str = CHAT,
    **create: Any,
) -> Batch:
    """Upload ``lines`` and create a batch of them for ``endpoint`` (24h unless given)."""
    file = upload(sdk, lines)
    create.setdefault("completion_window", "24h")
    return sdk.batches.create(input_file_id=file.id, endpoint=endpoint, **create)  # type: ignore[arg-type]


def wait_batch(
    sdk: openai.OpenAI,
    batch_id: str,
    until: Callable[[Batch], bool] = lambda b: b.status in TERMINAL,
    within_s: float = 120.0,
) -> Batch:
    """Poll the batch until ``until`` holds (default: it ended); AssertionError on timeout."""
    deadline = time.monotonic() + within_s
    batch = sdk.batches.retrieve(batch_id)
    while not until(batch):
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch}"
        time.sleep(0.1)
        batch = sdk.batches.retrieve(batch_id)
    return batch


def file_lines(sdk: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    """The parsed lines of an output or error file (none when the batch has no such file)."""
    if file_id is None:
        return []
    text = sdk.files.content(file_id).content
    return [orjson.loads(line) for line in text.splitlines()]


def by_custom_id(lines: Sequence[dict[str, Any]]) -> dict[str | None, dict[str, Any]]:
    """Lines keyed by ``custom_id``; AssertionError if one appears twice."""
    keyed: dict[str | None, dict[str, Any]] = {}
    for line in lines:
        assert line["custom_id"] not in keyed, f"custom_id twice: {line['custom_id']}"
        keyed[line["custom_id"]] = line
    return keyed


def refusal(call: Callable[[], object]) -> tuple[int, dict[str, Any]]:
    """Run an SDK call that must fail; its status and OpenAI-shaped error object."""
    try:
        call()
    except openai.APIStatusError as exc:
        response = exc.response
        reply = Reply(
            response.status_code,
            {name.lower(): value for name, value in response.headers.items()},
            response.content,
        )
        return reply.status, openai_error(reply)
    raise AssertionError("the call succeeded")


def chat_works(live: Stack, key: str = KEY_A) -> None:
    """A chat completion through the gateway is answered (the gateway still serves)."""
    reply = client(live, key).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "still there?"}], max_tokens=3
    )
    assert reply.choices[0].message.content is not None
    assert reply.usage is not None
    assert reply.usage.completion_tokens > 0
