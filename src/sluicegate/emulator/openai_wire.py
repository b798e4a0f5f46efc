"""OpenAI wire format for the emulator: request parsing, response bodies, error shape."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import orjson

from sluicegate.core.prefix_blocks import prompt_text
from sluicegate.errors import SluicegateError

DEFAULT_MAX_TOKENS = 256
MAX_N = 128
"""The most choices one request may ask for (vLLM has no cap of its own but its batch)."""
CHARS_PER_TOKEN = 4
PRIORITY_BOUND = 2**63
"""``priority`` must lie in [-PRIORITY_BOUND, PRIORITY_BOUND): a signed 64-bit integer.
vLLM's own field (``priority: int``) has no bound; the emulator keeps it to what a
fixed-width integer holds rather than take arbitrarily large numbers."""

_T = TypeVar("_T")


class ApiError(SluicegateError):
    """A request the API refuses; rendered in the personality's error shape.

    Args:
        status: HTTP status.
        message: human-readable reason.
        code: machine-readable code (``invalid_request``, ``model_not_found``, …).
        param: the offending request field, if any.
    """

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """What the emulator needs from a (chat) completion request body.

    Attributes:
        prompt_tokens: estimated prompt size, ``max(1, ceil(chars / 4))``.
        max_tokens: output cap (``max_tokens`` or ``max_completion_tokens``, default 256).
        stream: answer with server-sent events.
        include_usage: ``stream_options.include_usage``: send a usage chunk before ``[DONE]``.
        ignore_eos: vLLM's extension: generate exactly ``max_tokens`` tokens.
        n: choices: as vLLM runs them, ``n`` sequences side by side in the engine (each
            up to ``max_tokens``), one usage covering all of them.
        priority: vLLM's ``priority`` field (default 0, lower runs first); an engine
            started with ``--scheduling-policy priority`` orders and preempts by it, an
            ``fcfs`` one refuses any but 0 (``EngineRunner.submit``).
        text: the prompt as text (``core.prefix_blocks.prompt_text``), which the
            emulator hashes into KV blocks for prefix caching; empty for token ids.
    """

    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    ignore_eos: bool
    n: int = 1
    priority: int = 0
    text: str = ""


def _invalid(message: str, param: str | None) -> ApiError:
    return ApiError(400, message, "invalid_request", param)


def _field(body: dict[str, object], key: str, kind: type[_T], name: str) -> _T | None:
    """``body[key]`` checked to be a ``kind`` (``bool`` is not an ``int`` here), or None."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _invalid(f"'{key}' must be {name}", key)
    return value


def _chars_of_content(content: object) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    if not isinstance(content, list):
        raise _invalid("message content must be a string or a list of parts", "messages")
    chars = 0
    for part in content:
        if not isinstance(part, dict):
            raise _invalid("each content part must be an object", "messages")
        text = part.get("text")
        if part.get("type") == "text":
            if not isinstance(text, str):
                raise _invalid("a text content part needs a string 'text'", "messages")
            chars += len(text)
    return chars


def _chat_prompt_tokens(body: dict[str, object]) -> int:
    messages = _field(body, "messages", list, "a list of messages")
    if not messages:
        raise _invalid("'messages' must be a non-empty list", "messages")
    chars = 0
    for message in messages:
        if not isinstance(message, dict):
            raise _invalid("each message must be an object", "messages")
        chars += _chars_of_content(message.get("content"))
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))


def _completion_prompt_tokens(body: dict[str, object]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return max(1, math.ceil(len(prompt) / CHARS_PER_TOKEN))
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return len(prompt)  # token ids
        if all(isinstance(p, str) for p in prompt):
            if len(prompt) > 1:
                raise _invalid("batched prompts are not supported: send one per request", "prompt")
            return max(1, math.ceil(len(prompt[0]) / CHARS_PER_TOKEN))
    raise _invalid("'prompt' must be a string, a list of one string, or token ids", "prompt")


def _max_tokens(body: dict[str, object]) -> int:
    for key in ("max_tokens", "max_completion_tokens"):
        value = _field(body, key, int, "an integer")
        if value is not None:
            if value < 1:
                raise _invalid(f"'{key}' must be >= 1, got {value}", key)
            return value
    return DEFAULT_MAX_TOKENS


def parse_body(raw: bytes, model: str) -> dict[str, object]:
    """A request body as a JSON object that names ``model`` (or no model).

    Raises:
        ApiError: 400 for bad JSON or a body that is not an object; 404 for another model.
    """
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _invalid(f"request body is not valid JSON: {exc}", None) from exc
    if not isinstance(body, dict):
        raise _invalid("request body must be a JSON object", None)
    named = _field(body, "model", str, "a string")
    if named is not None and named != model:
        raise ApiError(404, f"The model `{named}` does not exist.", "model_not_found", "model")
    return body


def parse_request(raw: bytes, *, chat: bool, model: str) -> CompletionRequest:
    """Parse and validate a ``/v1/chat/completions`` or ``/v1/completions`` body.

    Raises:
        ApiError: 400 for bad JSON or wrong types (a ``priority`` that is not an integer:
            a string, a float or a boolean), ``n`` outside 1…``MAX_N`` or a ``priority``
            outside a signed 64-bit integer; 404 when the body names a model other than
            ``model`` (an absent model means it).
    """
    body = parse_body(raw, model)
    n = _field(body, "n", int, "an integer")
    if n is not None and not 1 <= n <= MAX_N:
        raise _invalid(f"'n' must be between 1 and {MAX_N}, got {n}", "n")
    priority = _field(body, "priority", int, "an integer") or 0
    if not -PRIORITY_BOUND <= priority < PRIORITY_BOUND:
        raise _invalid(f"'priority' must be a signed 64-bit integer, got {priority}", "priority")
    options = _field(body, "stream_options", dict, "an object") or {}
    include_usage = _field(options, "include_usage", bool, "a boolean")
    return CompletionRequest(
        prompt_tokens=_chat_prompt_tokens(body) if chat else _completion_prompt_tokens(body),
        max_tokens=_max_tokens(body),
        stream=bool(_field(body, "stream", bool, "a boolean")),
        include_usage=bool(include_usage),
        ignore_eos=bool(_field(body, "ignore_eos", bool, "a boolean")),
        n=n or 1,
        priority=priority,
        text=prompt_text(body),
    )


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass(frozen=True, slots=True)
class OpenAIShape:
    """Builds one response's OpenAI bodies: ``chat.completion[.chunk]`` or ``text_completion``.

    Attributes:
        chat: chat completions (else legacy completions).
        resp_id: the response's ``id``.
        model: the served model name.
        created: Unix time of the response.
    """

    chat: bool
    resp_id: str
    model: str
    created: int

    def _envelope(self, choices: list[dict[str, object]], *, chunk: bool) -> dict[str, object]:
        kind = "text_completion"
        if self.chat:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        return {
            "id": self.resp_id, "object": kind, "created": self.created,
            "model": self.model, "choices": choices,
        }  # fmt: skip

    def _choice(
        self, text: str, finish_reason: str | None, *, first: bool, index: int
    ) -> dict[str, object]:
        if not self.chat:
            return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}
        delta: dict[str, str] = {"role": "assistant"} if first else {}
        if text or first:
            delta["content"] = text
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    def chunk(self, text: str, *, first: bool, index: int = 0) -> dict[str, object]:
        """A streamed chunk carrying one token of choice ``index`` (its first also carries
        the assistant role)."""
        return self._envelope([self._choice(text, None, first=first, index=index)], chunk=True)

    def finish_chunk(self, reason: str, index: int = 0) -> dict[str, object]:
        """The streamed chunk that carries choice ``index``'s ``finish_reason`` and no text."""
        choice = self._choice("", reason, first=False, index=index)
        return self._envelope([choice], chunk=True)

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict[str, object]:
        """The ``stream_options.include_usage`` chunk: no choices, only ``usage``."""
        body = self._envelope([], chunk=True)
        body["usage"] = _usage(prompt_tokens, completion_tokens)
        return body

    def body(
        self, answers: list[tuple[str, str]], prompt_tokens: int, completion_tokens: int
    ) -> dict[str, object]:
        """The whole non-streamed response: one choice per (text, finish reason), with
        ``usage`` (the prompt once, every choice's tokens)."""
        choices: list[dict[str, object]] = []
        for index, (text, reason) in enumerate(answers):
            if self.chat:
                message = {"role": "assistant", "content": text}
                choices.append({
                    "index": index, "message": message, "logprobs": None, "finish_reason": reason,
                })  # fmt: skip
            else:
                choices.append(
                    {"index": index, "text": text, "logprobs": None, "finish_reason": reason}
                )
        body = self._envelope(choices, chunk=False)
        body["usage"] = _usage(prompt_tokens, completion_tokens)
        return body
