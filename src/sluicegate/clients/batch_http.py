"""The HTTP side of ``sluicegate batch``: the gateway's Files and Batches APIs over aiohttp.

The API key is sent as ``Authorization: Bearer`` and appears nowhere else: no
message, error or exception this module makes contains it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from sluicegate.errors import SluicegateError

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 120.0
SHOWN_BODY_CHARS = 200
"""How much of a non-OpenAI error body an error message quotes."""


ID_SHAPES = {
    "batch": re.compile(r"batch_[A-Za-z0-9_-]{1,64}"),
    "file": re.compile(r"file-[A-Za-z0-9_-]{1,64}"),
}
"""OpenAI's id shapes (``batch_…``, ``file-…``): a prefix, then letters, digits, ``_`` and
``-``. Nothing else may become part of a path or a URL (no ``/``, ``.``, ``\\`` or NUL)."""
SHOWN_ID_CHARS = 80


class BatchCliError(SluicegateError):
    """Something ``sluicegate batch`` cannot do: a bad argument, the gateway unreachable
    or refusing. Its message is safe to print (it never holds the API key)."""


class GatewayRefusedError(BatchCliError):
    """The gateway answered an error: its HTTP status and OpenAI ``code`` and ``message``."""

    def __init__(self, status: int, code: str | None, message: str) -> None:
        shown = f"{message} ({code}, HTTP {status})" if code else f"{message} (HTTP {status})"
        super().__init__(shown)
        self.status = status
        self.code = code
        self.message = message

    @property
    def transient(self) -> bool:
        """Whether asking again later may work (rate limited, overloaded, draining)."""
        return self.status in (429, 502, 503, 504)


class GatewayUnreachableError(BatchCliError):
    """No HTTP answer from the gateway (refused, reset, timed out)."""


def checked_id(kind: str, value: object, *, source: str) -> str:
    """``value`` if it is an OpenAI ``kind`` id (``batch`` or ``file``), else a
    ``BatchCliError`` saying where it came from (``source``: the argument or the
    gateway's answer); an id is checked before it names a file or a URL."""
    if isinstance(value, str) and ID_SHAPES[kind].fullmatch(value):
        return value
    shown = repr(value)[:SHOWN_ID_CHARS]
    prefix = "batch_" if kind == "batch" else "file-"
    raise BatchCliError(
        f"{source} {shown} is not a {kind} id ({prefix} then up to 64 letters, digits, _ or -)"
    )


def base_url(url: str) -> str:
    """The gateway's root URL from what a user typed: ``http(s)://host:port``, with a
    trailing ``/`` or ``/v1`` (an OpenAI SDK ``base_url``) dropped."""
    cleaned = url.strip().rstrip("/")
    scheme, _, rest = cleaned.partition("://")
    if scheme not in ("http", "https") or not rest:
        raise BatchCliError(f"--url must be an http:// or https:// URL, got {url!r}")
    return cleaned.removesuffix("/v1")


def api_key(env_name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The API key held by the variable ``env_name`` (None when unset or empty: a gateway
    without tenants' keys needs none)."""
    return (environ if environ is not None else os.environ).get(env_name) or None


def refusal(status: int, body: bytes) -> GatewayRefusedError:
    """The error an HTTP error answer means: OpenAI's ``error`` object when it is one,
    else the start of the body."""
    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        code = error.get("code")
        return GatewayRefusedError(
            status, code if isinstance(code, str) else None, error["message"]
        )
    text = body.decode("utf-8", "replace").strip()[:SHOWN_BODY_CHARS]
    return GatewayRefusedError(status, None, text or "no error message")


class BatchClient:
    """One session with a gateway's Files and Batches APIs (an async context manager)."""

    def __init__(self, url: str, key: str | None) -> None:
        self.url = base_url(url)
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> BatchClient:
        timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S)
        self._session = aiohttp.ClientSession(headers=self._headers, timeout=timeout)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def _json(
        self,
        method: str,
        path: str,
        *,
        data: aiohttp.FormData | None = None,
        json: object = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        assert self._session is not None, "use BatchClient as an async context manager"
        try:
            async with self._session.request(
                method, self.url + path, data=data, json=json, headers=headers, params=params
            ) as response:
                body = await response.read()
                if response.status >= 400:
                    raise refusal(response.status, body)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise GatewayUnreachableError(_unreachable(self.url, exc)) from None
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            raise GatewayRefusedError(response.status, None, f"{method} {path}: not a JSON object")
        return answer

    async def upload(self, path: Path) -> dict[str, Any]:
        """``POST /v1/files`` (``purpose: batch``): the file object of the uploaded JSONL."""
        with path.open("rb") as stream:
            form = aiohttp.FormData()
            form.add_field("purpose", "batch")
            form.add_field("file", stream, filename=path.name, content_type="application/jsonl")
            return await self._json("POST", "/v1/files", data=form)

    async def create(
        self,
        file_id: str,
        endpoint: str,
        window: str,
        *,
        lane: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """``POST /v1/batches``: the new batch object (in ``lane`` when given)."""
        body: dict[str, Any] = {
            "input_file_id": file_id,
            "endpoint": endpoint,
            "completion_window": window,
        }
        if metadata:
            body["metadata"] = dict(metadata)
        headers = {"X-Sluicegate-Lane": lane} if lane else None
        return await self._json("POST", "/v1/batches", json=body, headers=headers)

    async def batch(self, batch_id: str) -> dict[str, Any]:
        """``GET /v1/batches/{id}``."""
        return await self._json("GET", f"/v1/batches/{_segment(batch_id)}")

    async def batches(self, limit: int) -> dict[str, Any]:
        """``GET /v1/batches?limit=N``: the newest batches, as OpenAI's list object."""
        return await self._json("GET", "/v1/batches", params={"limit": str(limit)})

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        """``POST /v1/batches/{id}/cancel``."""
        return await self._json("POST", f"/v1/batches/{_segment(batch_id)}/cancel")

    async def download(self, file_id: str, target: Path) -> int:
        """Stream ``GET /v1/files/{id}/content`` into ``target`` (written whole or not at
        all); how many lines it holds."""
        assert self._session is not None, "use BatchClient as an async context manager"
        partial = target.with_name(target.name + ".part")
        lines = 0
        try:
            async with self._session.get(
                f"{self.url}/v1/files/{_segment(file_id)}/content"
            ) as response:
                if response.status >= 400:
                    raise refusal(response.status, await response.read())
                # Not through a symlink planted at the temporary name.
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                with os.fdopen(os.open(partial, flags, 0o666), "wb") as out:
                    async for chunk in response.content.iter_chunked(1 << 16):
                        out.write(chunk)
                        lines += chunk.count(b"\n")
            partial.replace(target)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise GatewayUnreachableError(_unreachable(self.url, exc)) from None
        finally:
            partial.unlink(missing_ok=True)
        return lines


def _segment(object_id: str) -> str:
    """An id as one URL path segment (an id with ``/`` or ``?`` cannot name another route)."""
    from urllib.parse import quote

    return quote(object_id, safe="")


def _unreachable(url: str, exc: BaseException) -> str:
    reason = str(exc) or type(exc).__name__
    return f"cannot reach the gateway at {url}: {reason}"
