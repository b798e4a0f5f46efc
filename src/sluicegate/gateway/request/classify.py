"""Parse what scheduling needs from an OpenAI request body, and classify it.

Reads only ``model``, ``stream``, ``max_tokens``/``max_completion_tokens``,
``n``, ``priority`` and the size of the prompt/messages/input; everything else
passes through to the engine untouched (the original bytes are forwarded).

Numbers scheduling reads are refused when out of range (400 naming the field),
never silently capped: the engine receives the original body, so a capped
value would make the gateway account for a request other than the one that runs.
``null`` for an optional field means "not given". Arrays the estimate walks
(messages, content parts, prompt/input entries) are capped at ``MAX_ITEMS``
before any counting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import orjson

from sluicegate.core.prefix_blocks import block_hashes, prompt_text
from sluicegate.core.spec import ModelSpec, TenantSpec
from sluicegate.core.ticket import MAX_PRIORITY, MIN_PRIORITY
from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.streams.endpoint_kind import Endpoint

MESSAGE_OVERHEAD_TOKENS = 4
MAX_N = 16
MAX_TOKENS_LIMIT = 10_000_000
# Messages, content parts (all messages together) and prompt/input entries.
MAX_ITEMS = 4096
# Deeper JSON is refused: engines parse with Python's json (recursion limit ~1000) and
# answer a plain-text 500; orjson itself stops at 1024 and re-serialises only 255 deep.
MAX_DEPTH = 64
# Sampling fields engines parse strictly (a wrong type is an engine 500, not a 400).
_NUMBER_FIELDS = ("temperature", "top_p", "frequency_penalty", "presence_penalty", "min_p")
_INTEGER_FIELDS = ("top_k", "seed")
_PRIORITY_VALUES = frozenset(str(p) for p in range(MIN_PRIORITY, MAX_PRIORITY + 1))


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """The scheduling-relevant facts of one request body."""

    model: str
    stream: bool
    max_tokens: int | None
    n: int
    prompt_chars: int
    messages: int
    priority: int | None
    prefix: str
    body: dict[str, object] = field(default_factory=dict, compare=False, repr=False)
    """The parsed body itself, for what only some models read (``prompt_block_hashes``)."""


def _bad(message: str, param: str | None = None, code: str = "invalid_request") -> GatewayError:
    return GatewayError(400, code, message, param=param)


def _int_field(body: dict[str, object], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{name}' must be an integer", name)
    if not low <= value <= high:
        raise _bad(f"'{name}' must be between {low} and {high}, got {value}", name)
    return value


def _too_many(name: str, count: int, what: str = "entries") -> GatewayError:
    return _bad(
        f"'{name}' has {count} {what}; at most {MAX_ITEMS} are accepted",
        name,
        "array_above_max_length",
    )


def _content_chars(content: object, where: str) -> tuple[int, int]:
    """(characters, parts) of one message's content."""
    if content is None:
        return 0, 0
    if isinstance(content, str):
        return len(content), 0
    if isinstance(content, list):
        if len(content) > MAX_ITEMS:
            raise _too_many(where, len(content))
        total = 0
        for part in content:
            if not isinstance(part, dict):
                raise _bad(f"{where} parts must be objects", where)
            text = part.get("text")
            if isinstance(text, str):
                total += len(text)
        return total, len(content)
    raise _bad(f"{where} must be a string or a list of parts", where)


PREFIX_CHARS = 256


def _leading_text(body: dict[str, object], endpoint: Endpoint) -> str:
    """The first characters of the prompt, for prefix-affinity routing."""
    if endpoint == "chat":
        messages = body.get("messages")
        first = messages[0] if isinstance(messages, list) and messages else None
        content = first.get("content") if isinstance(first, dict) else None
        if isinstance(content, list):
            content = next((p.get("text") for p in content if isinstance(p, dict)), None)
        return content[:PREFIX_CHARS] if isinstance(content, str) else ""
    prompt = body.get("prompt" if endpoint == "completions" else "input")
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]
    return prompt[:PREFIX_CHARS] if isinstance(prompt, str) else ""


def _prompt_size(body: dict[str, object], endpoint: Endpoint) -> tuple[int, int]:
    """(characters, messages) of what the engine will read as the prompt."""
    if endpoint == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("'messages' must be a non-empty list", "messages")
        if len(messages) > MAX_ITEMS:
            raise _too_many("messages", len(messages))
        chars = parts = 0
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise _bad("each message must be an object", f"messages[{i}]")
            where = f"messages[{i}].content"
            more_chars, more_parts = _content_chars(message.get("content"), where)
            chars += more_chars
            parts += more_parts
            if parts > MAX_ITEMS:
                raise _too_many("messages", parts, "content parts in all")
        # After the contents: a message that lacks both is named by its content first.
        for i, message in enumerate(messages):
            role = message.get("role")
            if not isinstance(role, str) or not role:
                raise _bad("each message needs a 'role' string", f"messages[{i}].role")
        return chars, len(messages)
    key = "prompt" if endpoint == "completions" else "input"
    prompt = body.get(key)
    if isinstance(prompt, str):
        return len(prompt), 0
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return 4 * len(prompt), 0  # token ids: one token each, at ~4 chars per token
        if len(prompt) > MAX_ITEMS:
            raise _too_many(key, len(prompt))
        if all(isinstance(p, str) for p in prompt):
            return sum(len(p) for p in prompt if isinstance(p, str)), 0
        if all(isinstance(p, list) for p in prompt):
            return 4 * sum(len(p) for p in prompt if isinstance(p, list)), 0
    raise _bad(f"'{key}' must be a string, a list of strings, or token ids", key)


def parse_body(raw: bytes, endpoint: Endpoint) -> ParsedRequest:
    """Parse and check the fields scheduling reads; ``GatewayError(400)`` names the bad one."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise _bad("request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object", code="invalid_json")
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:
        _check_depth(body)
    _check_sampling(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' must be a non-empty string", "model")
    stream = body.get("stream")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream")
    if endpoint == "embeddings" and stream:
        raise _bad("embeddings cannot stream", "stream")
    max_tokens = _int_field(body, "max_completion_tokens", 1, MAX_TOKENS_LIMIT)
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens", 1, MAX_TOKENS_LIMIT)
    n = _int_field(body, "n", 1, MAX_N) or 1
    priority = _int_field(body, "priority", MIN_PRIORITY, MAX_PRIORITY)
    chars, messages = _prompt_size(body, endpoint)
    prefix = _leading_text(body, endpoint)
    return ParsedRequest(model, stream, max_tokens, n, chars, messages, priority, prefix, body)


def prompt_block_hashes(parsed: ParsedRequest, model: ModelSpec) -> tuple[int, ...]:
    """The prompt's KV block hashes (``core/prefix_blocks.py``, cut by the model's
    ``prefix_routing``) when ``model`` is routed by ``precise_prefix``, the one router that
    reads them; empty otherwise, so other models pay nothing (a 6k-character prompt, 93
    blocks of 16 tokens, costs ~90 µs)."""
    if model.router != "precise_prefix":
        return ()
    routing = model.prefix_routing
    return block_hashes(prompt_text(parsed.body), routing.block_tokens, routing.chars_per_token)


def _check_depth(body: object) -> None:
    """``GatewayError(400)`` if ``body`` nests arrays/objects deeper than ``MAX_DEPTH``."""
    stack: list[tuple[object, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _bad(f"request body nests deeper than {MAX_DEPTH} levels", code="invalid_json")
        if isinstance(value, dict):
            stack.extend((child, depth + 1) for child in value.values())
        elif isinstance(value, list):
            stack.extend((child, depth + 1) for child in value)


def _check_sampling(body: dict[str, object]) -> None:
    """Type checks of the sampling fields engines parse strictly."""
    for name in _NUMBER_FIELDS:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise _bad(f"'{name}' must be a number", name)
    for name in _INTEGER_FIELDS:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise _bad(f"'{name}' must be an integer", name)
    stop = body.get("stop")
    if not (
        stop is None
        or isinstance(stop, str)
        or (isinstance(stop, list) and all(isinstance(item, str) for item in stop))
    ):
        raise _bad("'stop' must be a string or a list of strings", "stop")


def check_choices(model: ModelSpec, n: int) -> None:
    """``GatewayError(400)`` if ``n`` choices can never run at once on ``model``.

    ``n`` choices take ``n`` units of concurrency (engine sequences side by side): more
    than the model's ``max_concurrency``, or than the largest backend's cap when every
    backend has one (llama.cpp's slots: it would wait for ``n`` free slots forever),
    cannot be admitted, so they are refused rather than clamped (the engine gets the
    body as sent, and a clamped ``n`` would answer fewer choices than asked).
    """
    caps = [backend.max_concurrency for backend in model.backends]
    most = model.max_concurrency
    if caps and None not in caps:
        most = min(most, max(cap for cap in caps if cap is not None))
    if n > most:
        raise _bad(
            f"'n' is {n}, but model {model.name!r} runs at most {most} sequences at once"
            f" and each choice is one: ask for at most {most}",
            "n",
        )


def estimate_prompt_tokens(parsed: ParsedRequest, chars_per_token: float) -> int:
    """Prompt tokens from characters (plus a small per-message overhead for chat)."""
    return math.ceil(parsed.prompt_chars / chars_per_token) + (
        MESSAGE_OVERHEAD_TOKENS * parsed.messages
    )


@dataclass(frozen=True, slots=True)
class Classification:
    """Lane, priority and deadline of a request."""

    lane: str
    priority: int
    deadline_ms: float | None


def classify(
    model: ModelSpec,
    tenant: TenantSpec,
    *,
    lane_header: str | None,
    priority_header: str | None,
    deadline_header: str | None,
    body_priority: int | None,
) -> Classification:
    """Lane from the header if the tenant may use it, priority capped, deadline from the header.

    A lane the tenant may not use is refused (403); a priority more important
    than the tenant's ``max_priority`` is lowered to it, not refused.
    """
    lanes = {lane.name for lane in model.lanes}
    if lane_header:
        if lane_header not in lanes:
            raise GatewayError(
                400, "invalid_lane", f"model {model.name!r} has no lane {lane_header!r}"
            )
        if tenant.allowed_lanes is not None and lane_header not in tenant.allowed_lanes:
            raise GatewayError(403, "lane_not_allowed", f"lane {lane_header!r} is not allowed")
        lane = lane_header
    else:
        lane = tenant.default_lane if tenant.default_lane in lanes else model.lanes[0].name
    priority = tenant.default_priority if body_priority is None else body_priority
    if priority_header:
        # A set lookup, not int(): str.isdigit() admits "²" (a Latin-1 header byte) and
        # int() refuses it, or any string of over 4300 digits.
        if priority_header not in _PRIORITY_VALUES:
            raise GatewayError(
                400,
                "invalid_priority",
                f"X-Sluicegate-Priority must be an integer in [{MIN_PRIORITY}, {MAX_PRIORITY}]",
            )
        priority = int(priority_header)
    priority = max(priority, tenant.max_priority)
    deadline_ms = None
    if deadline_header:
        try:
            deadline_ms = float(deadline_header)
        except ValueError:
            deadline_ms = math.nan
        if not math.isfinite(deadline_ms) or deadline_ms <= 0:
            raise GatewayError(
                400, "invalid_deadline", "X-Sluicegate-Deadline-Ms must be a positive number"
            )
    return Classification(lane, priority, deadline_ms)
