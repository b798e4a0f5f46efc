"""What a reassembled answer keeps of each streamed chunk: every field, merged as the
engine's non-streamed answer holds it (``gateway/streams/assemble.py`` reads the stream).

Per choice (by its ``index``): the text fields — ``content``, ``reasoning_content``
and ``reasoning`` of a chat delta, ``text`` of a completion — are kept as JSON string
tokens and decoded together at the end; every other field of the deltas merges into
the message (strings concatenated, such as ``refusal`` and a tool call's
``arguments``; ``tool_calls`` by their ``index``), and the choice's own fields too
(``logprobs`` lists joined, ``stop_reason`` the last given). ``usage`` is kept whole
(``prompt_tokens_details``, …); an engine that sends one usage chunk per choice
(llama.cpp's server with ``n`` > 1) has its completion tokens added up.
"""

from __future__ import annotations

import orjson

from sluicegate.gateway.streams.delta_template import decoded_tokens

COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")
TEXT_FIELDS = {"chat": ("content", "reasoning_content", "reasoning"), "completions": ("text",)}
"""A delta's (completions: a choice's) text fields: concatenated, each may be templated."""
KEPT_FIRST = frozenset({"role", "id", "type"})
"""Strings of a delta that name rather than continue: the first one given stands."""
TOP_OWN = frozenset({"id", "object", "created", "model", "choices", "usage", "error"})
"""Top-level fields the assembler sets itself; every other one is kept as sent."""
CHOICE_OWN = frozenset({"index", "delta", "text", "finish_reason"})


def checked_usage(usage: dict[str, object]) -> dict[str, object] | None:
    """An engine's ``usage`` as it came (details included), if its token counts are
    non-negative integers; those that are not are left out (None if none is)."""
    counts = {
        name: value for name in COUNTS if type(value := usage.get(name)) is int and value >= 0
    }
    if not counts:
        return None
    return {**counts, **{k: v for k, v in usage.items() if k not in COUNTS}}


def added_usage(first: dict[str, object], more: dict[str, object]) -> dict[str, object]:
    """Two usage chunks of one answer (one per choice): the completion tokens added, the
    prompt (shared) counted once, the rest of the first."""
    total = dict(first)
    prompt = max(_count(first, "prompt_tokens"), _count(more, "prompt_tokens"))
    completion = _count(first, "completion_tokens") + _count(more, "completion_tokens")
    total.update(prompt_tokens=prompt, completion_tokens=completion)
    total["total_tokens"] = prompt + completion
    return total


def _count(usage: dict[str, object], name: str) -> int:
    value = usage.get(name)
    return value if isinstance(value, int) else 0


def merge(into: dict[str, object], key: str, value: object, *, concat: bool) -> None:
    """Fold one streamed field into what the earlier chunks gave: ``null`` adds nothing,
    dicts merge field by field, lists of ``index``-ed objects (tool calls) by index and
    other lists are joined; strings are joined when ``concat`` (a delta's, except those
    in ``KEPT_FIRST``); any other value replaces the earlier one."""
    old = into.get(key)
    if value is None:
        into.setdefault(key, None)
    elif isinstance(old, str) and isinstance(value, str):
        if key in KEPT_FIRST:
            return
        into[key] = old + value if concat else value
    elif isinstance(old, dict) and isinstance(value, dict):
        for name, item in value.items():
            merge(old, name, item, concat=concat)
    elif isinstance(old, list) and isinstance(value, list):
        _merge_list(old, value, concat=concat)
    else:
        into[key] = value


def _merge_list(old: list[object], more: list[object], *, concat: bool) -> None:
    """Tool calls (objects with an ``index``) merge into the one with that index; other
    items (log probabilities) are appended."""
    for item in more:
        if isinstance(item, dict) and type(index := item.get("index")) is int:
            same = next((o for o in old if isinstance(o, dict) and o.get("index") == index), None)
            if same is not None:
                for name, value in item.items():
                    merge(same, name, value, concat=concat)
                continue
        old.append(item)


def _unindexed(call: object) -> object:
    """A merged tool call without the ``index`` its deltas were matched by."""
    return {k: v for k, v in call.items() if k != "index"} if isinstance(call, dict) else call


class ChoiceParts:
    """One choice of the answer as read so far: its texts (JSON string tokens, per
    field), its own fields, its message's other fields and its finish reason."""

    __slots__ = ("finish_reason", "message", "own", "texts")

    def __init__(self) -> None:
        self.texts: dict[str, list[bytes]] = {}
        self.own: dict[str, object] = {}  # the choice's fields (logprobs, stop_reason, …)
        self.message: dict[str, object] = {}  # the deltas' other fields (role, tool_calls…)
        self.finish_reason: str | None = None

    def joined(self) -> tuple[dict[str, str], bool]:
        """The texts so far, per field, each decoded in one call (compacted to one token
        for a later call); and whether any token was not a valid JSON string (it is
        left out)."""
        joined: dict[str, str] = {}
        bad = False
        for key, tokens in self.texts.items():
            strings = decoded_tokens(tokens)
            if strings is None:
                strings = []
                for token in tokens:
                    one = decoded_tokens([token])
                    if one is None:
                        bad = True
                    else:
                        strings.extend(one)
            joined[key] = text = "".join(strings)
            tokens[:] = [orjson.dumps(text)] if tokens else []
        return joined, bad

    def body(
        self, index: int, texts: dict[str, str], reason: str, chat: bool, *, bare: bool = False
    ) -> dict[str, object]:
        """The choice as a non-streamed answer holds it (``bare``: only its index, texts
        and finish reason)."""
        own = {} if bare else self.own
        if not chat:
            text = texts.get("text", "")
            return {"index": index, "text": text, **own, "finish_reason": reason}
        message: dict[str, object] = {"role": "assistant", "content": ""}
        if not bare:
            message.update(self.message)  # a null content (tool calls only) stays null
            if not isinstance(message["role"], str):
                message["role"] = "assistant"
        message.update(texts)
        calls = message.get("tool_calls")
        if isinstance(calls, list):  # a streamed call's index is not in the answer's
            message["tool_calls"] = [_unindexed(call) for call in calls]
        return {"index": index, "message": message, **own, "finish_reason": reason}
