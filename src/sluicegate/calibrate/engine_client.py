"""A client that times single completions on an engine, token by token.

Each request is a streamed ``POST /v1/completions`` whose prompt is a list of token ids
(so its length is exact and no tokenizer is needed), asking for exactly ``max_tokens``
tokens (``ignore_eos``; vLLM also ``min_tokens``). A ``RequestRecord`` keeps, on the
client's clock (``time.perf_counter``): when it was sent, when each token-bearing chunk
arrived, and when the response ended; and llama-server's own per-request ``timings``
(server side: prompt and generation time) when the engine sends them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from sluicegate.errors import SluicegateError

ENGINE_KINDS = ("llama-server", "vllm", "emulator")
"""The engines ``sluicegate calibrate`` knows what to ask of."""

_JSON = {"Content-Type": "application/json"}
"""A gateway (ours, OpenAI's) refuses a body it is not told is JSON."""


class EngineRequestError(SluicegateError, RuntimeError):
    """The engine refused or broke a probe request (status and the start of its body)."""


@dataclass(frozen=True, slots=True)
class ServerTimings:
    """llama-server's ``timings`` for one request (server side, milliseconds → seconds).

    Attributes:
        prompt_tokens: prompt tokens it processed (``prompt_n``; not from its cache).
        prompt_s: time to process them and sample the first token (``prompt_ms``).
        step_s: generation time per step after the first token (``predicted_per_token_ms``).
        generated_tokens: tokens it generated (``predicted_n``).
    """

    prompt_tokens: int
    prompt_s: float
    step_s: float
    generated_tokens: int


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request's times on the client's clock, and the server's own when it gave them.

    Attributes:
        sent_s: when the request was sent.
        token_s: arrival of each chunk that carried a token.
        end_s: when the response ended (its last byte read).
        prompt_tokens: prompt size as the engine counted it (else as sent).
        timings: llama-server's ``timings``; None from other engines.
    """

    sent_s: float
    token_s: tuple[float, ...]
    end_s: float
    prompt_tokens: int
    timings: ServerTimings | None

    @property
    def first_token_s(self) -> float:
        """Time to first token, as the client saw it."""
        return self.token_s[0] - self.sent_s

    @property
    def tail_s(self) -> float:
        """From the last token's arrival to the end of the response."""
        return self.end_s - self.token_s[-1]

    def gaps_s(self) -> list[float]:
        """The gaps between consecutive tokens' arrivals."""
        return [b - a for a, b in zip(self.token_s, self.token_s[1:], strict=False)]


def completion_body(kind: str, model: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """The request body for ``kind``: greedy, exactly ``max_tokens`` out, never cached
    by llama-server (``cache_prompt: false``; other engines get unique prompts)."""
    body: dict[str, Any] = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
        "stream_options": {"include_usage": True}, "temperature": 0.0, "ignore_eos": True,
    }  # fmt: skip
    if kind == "llama-server":
        body["cache_prompt"] = False
    elif kind == "vllm":
        body["min_tokens"] = max_tokens
    return body


def _timings(payload: dict[str, Any]) -> ServerTimings:
    return ServerTimings(
        prompt_tokens=int(payload["prompt_n"]),
        prompt_s=float(payload["prompt_ms"]) / 1000.0,
        step_s=float(payload["predicted_per_token_ms"]) / 1000.0,
        generated_tokens=int(payload["predicted_n"]),
    )


def _carries_token(chunk: dict[str, Any]) -> bool:
    """A chunk with text, or without a finish reason (a token whose text is pending)."""
    choices = chunk.get("choices") or []
    if not choices:
        return False
    choice = choices[0]
    return bool(choice.get("text")) or choice.get("finish_reason") is None


async def time_completion(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> RequestRecord:
    """Send one streamed completion and time it.

    Raises:
        EngineRequestError: a status other than 200, an error event, or no token.
    """
    token_s: list[float] = []
    prompt_tokens = len(body["prompt"])
    timings: ServerTimings | None = None
    sent = time.perf_counter()
    endpoint = url.rstrip("/") + "/v1/completions"
    async with session.post(endpoint, data=orjson.dumps(body), headers=_JSON) as resp:
        if resp.status != 200:
            text = (await resp.read())[:300].decode(errors="replace")
            raise EngineRequestError(f"the engine answered {resp.status}: {text}")
        buffer = b""
        async for piece in resp.content.iter_any():
            now = time.perf_counter()
            buffer += piece
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                data = event.strip().removeprefix(b"data:").strip()
                if not data or data.startswith(b":") or data == b"[DONE]":
                    continue
                chunk = orjson.loads(data)
                if "error" in chunk:
                    raise EngineRequestError(f"the engine sent an error: {chunk['error']}")
                if _carries_token(chunk):
                    token_s.append(now)
                if "timings" in chunk:
                    timings = _timings(chunk["timings"])
                usage = chunk.get("usage")
                if usage and usage.get("prompt_tokens"):
                    prompt_tokens = int(usage["prompt_tokens"])
    end = time.perf_counter()
    if not token_s:
        raise EngineRequestError("the engine streamed no token")
    if timings is not None:
        prompt_tokens = timings.prompt_tokens
    return RequestRecord(sent, tuple(token_s), end, prompt_tokens, timings)
