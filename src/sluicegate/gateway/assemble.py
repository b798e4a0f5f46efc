"""Rebuild a non-streaming OpenAI answer from a stream, so a preempted request keeps its text.

A non-streaming request that may be preempted with ``abort`` (or whose engine is
llama.cpp) is sent to the engine as a stream; the gateway gathers the events and
answers with a normal completion body. When the request is preempted, the body
holds what was generated so far, with ``finish_reason: "preempted"``.

The work is arranged to be cheap per event, since a long answer is hundreds of
them. Until the first output arrives, each read is read into events at once
(its time is the time to first token). After that a read is only appended and
its ``data:`` fields counted; every ``DIGEST_BYTES`` of reads, and at the end,
the held reads are framed into events by the shared ``SseSplitter`` in a few
bulk calls. An event is parsed at most once, and most are not parsed at all: the
latest plain content delta parsed is the ``DeltaTemplate``, and every later event
that is the same bytes around a different JSON string is that delta with other
text, whose string is kept as it came. All kept strings are decoded in one call
at the end, and the body is built once.

The answer keeps every field the engine sent, as its non-streamed answer would hold
it: the chunks' top-level fields (``system_fingerprint``, ``created``, …), the whole
``usage`` (``prompt_tokens_details``, …), and per choice every field of the deltas
merged into the message — ``content``, ``reasoning_content`` and ``reasoning``
concatenated in order (each may be the template's text), other strings concatenated
(``refusal``, a tool call's ``arguments``), ``tool_calls`` merged by ``index``, and
the choice's own fields (``logprobs`` lists joined, ``stop_reason`` the last given).
"""

from __future__ import annotations

import time

import orjson

from sluicegate.gateway.classify import Endpoint
from sluicegate.gateway.delta_template import DeltaTemplate, decoded_tokens
from sluicegate.gateway.scanner import DONE
from sluicegate.gateway.sse import SseSplitter, payloads_of

DIGEST_BYTES = 16 * 1024

# Fields whose streamed form this assembler does not merge: such requests are
# forwarded untouched instead.
UNMERGED_FIELDS = ("tools", "functions", "logprobs", "top_logprobs", "tool_choice")


def streamable_copy(raw: bytes) -> bytes | None:
    """``raw`` rewritten to stream with usage, or ``None`` if its answer can't be rebuilt."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict) or body.get("n", 1) != 1:
        return None
    if any(field in body for field in UNMERGED_FIELDS):
        return None
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    try:
        return orjson.dumps(body)
    except TypeError:  # nested deeper than orjson writes
        return None


_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")
TEXT_FIELDS = {"chat": ("content", "reasoning_content", "reasoning"), "completions": ("text",)}
"""A delta's (completions: a choice's) text fields: concatenated, each may be templated."""
_KEPT_FIRST = frozenset({"role", "id", "type"})
"""Strings of a delta that name rather than continue: the first one given stands."""
_TOP_OWN = frozenset({"id", "object", "created", "model", "choices", "usage", "error"})
_CHOICE_OWN = frozenset({"index", "delta", "text", "finish_reason"})


def _usage(usage: dict[str, object]) -> dict[str, object] | None:
    """An engine's ``usage`` as it came (details included), if its token counts are
    non-negative integers; those that are not are left out (None if none is)."""
    counts = {
        name: value for name in _COUNTS if type(value := usage.get(name)) is int and value >= 0
    }
    if not counts:
        return None
    return {**counts, **{k: v for k, v in usage.items() if k not in _COUNTS}}


def _merge(into: dict[str, object], key: str, value: object, *, concat: bool) -> None:
    """Fold one streamed field into what the earlier chunks gave: ``null`` adds nothing,
    dicts merge field by field, lists of ``index``-ed objects (tool calls) by index and
    other lists are joined; strings are joined when ``concat`` (a delta's, except those
    in ``_KEPT_FIRST``); any other value replaces the earlier one."""
    old = into.get(key)
    if value is None:
        into.setdefault(key, None)
    elif isinstance(old, str) and isinstance(value, str):
        if key in _KEPT_FIRST:
            return
        into[key] = old + value if concat else value
    elif isinstance(old, dict) and isinstance(value, dict):
        for name, item in value.items():
            _merge(old, name, item, concat=concat)
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
                    _merge(same, name, value, concat=concat)
                continue
        old.append(item)


def _unindexed(call: object) -> object:
    """A merged tool call without the ``index`` its deltas were matched by."""
    return {k: v for k, v in call.items() if k != "index"} if isinstance(call, dict) else call


class StreamAssembler:
    """Reads an OpenAI event stream and builds the non-streaming answer it amounts to.

    ``feed`` each read of the stream and ``close`` at its end; ``done``, ``error``
    (the engine sent an error event) and ``malformed`` (an event that is not a JSON
    object, or an unfinished one past the size cap) tell how it went, as far as the
    stream has been read into events; ``body`` builds the answer.
    """

    __slots__ = (
        "_choice",
        "_fields",
        "_held",
        "_held_bytes",
        "_held_events",
        "_message",
        "_splitter",
        "_template",
        "_texts",
        "_top",
        "chunks",
        "created",
        "done",
        "endpoint",
        "error",
        "finish_reason",
        "id",
        "malformed",
        "model",
        "usage",
    )

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.created = int(time.time())  # wall-clock seconds, as OpenAI's "created"
        self._fields = TEXT_FIELDS["chat" if endpoint == "chat" else "completions"]
        self._splitter = SseSplitter()
        self._template: DeltaTemplate | None = None
        self._held: list[bytes] = []  # reads not yet read into events
        self._held_bytes = 0
        self._held_events = 0  # data: fields in them, an estimate of their chunks
        # Per text field, its texts in order, each as a JSON string token, decoded
        # together at the end.
        self._texts: dict[str, list[bytes]] = {}
        self._top: dict[str, object] = {}  # the chunks' other top-level fields
        self._choice: dict[str, object] = {}  # the choice's own fields (logprobs, …)
        self._message: dict[str, object] = {}  # the deltas' other fields (role, tool_calls…)
        self.chunks = 0  # content chunks (non-empty texts) read so far
        self.done = False
        self.error = False
        self.malformed = False
        self.finish_reason: str | None = None
        self.usage: dict[str, object] | None = None
        self.id = ""
        self.model = ""

    @property
    def progress(self) -> int:
        """Content chunks so far: those read, plus one per ``data:`` field of the held reads
        (which may count an opening, closing or usage event as one)."""
        return self.chunks + self._held_events

    def feed(self, chunk: bytes) -> bool:
        """Take one read of the stream; return whether the answer's first output came with
        it (true once at most)."""
        if self.chunks:
            self._held.append(chunk)
            self._held_bytes += len(chunk)
            self._held_events += chunk.count(b"data:")
            if self._held_bytes >= DIGEST_BYTES:
                self._digest()
            return False
        self._take(self._splitter.feed(chunk)[1])
        return self.chunks > 0

    def close(self) -> None:
        """The stream ended: read what is held, and an event left without its blank line."""
        self._digest()
        self._take(self._splitter.close()[1])
        self._text()

    def _digest(self) -> None:
        """Read the held reads into events: a run of template events in bulk, the rest one
        by one."""
        if not self._held:
            return
        events = self._splitter.events(b"".join(self._held))
        self._held.clear()
        self._held_bytes = self._held_events = 0
        template = self._template
        if template is not None and events:
            if b"\r" in events:
                events = events.replace(b"\r\n", b"\n")
            run = template.run(events)
            if run is not None:
                before, tokens, after = run
                self._take(payloads_of(before))
                self._texts[template.key].extend(tokens)
                self.chunks += len(tokens) - tokens.count(b'""')
                self.id = template.id or self.id
                self.model = template.model or self.model
                self._take(payloads_of(after))
                return
        self._take(payloads_of(events) if events else [])

    def _take(self, payloads: list[bytes]) -> None:
        """Keep what the events of ``payloads`` say."""
        if self._splitter.overflowed:
            self.malformed = True
        template = self._template
        tokens = None if template is None else self._texts[template.key]
        for payload in payloads:
            if template is not None and (token := template.token(payload)) is not None:
                assert tokens is not None
                tokens.append(token)
                if len(token) > 2:
                    self.chunks += 1
                self.id = template.id or self.id
                self.model = template.model or self.model
            elif payload == DONE:
                self.done = True
            else:
                self._parse(payload)
                if self._template is not template:
                    template = self._template
                    tokens = None if template is None else self._texts[template.key]

    def _parse(self, payload: bytes) -> None:
        """Keep what one event says, parsing it; the latest plain delta becomes the
        template."""
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            event = None
        if not isinstance(event, dict):
            self.malformed = True
            return
        event_id, model, usage = event.get("id"), event.get("model"), event.get("usage")
        if isinstance(event_id, str) and event_id:
            self.id = event_id
        if isinstance(model, str) and model:
            self.model = model
        if isinstance(usage, dict):
            self.usage = _usage(usage)
        created = event.get("created")
        if type(created) is int and created >= 0:
            self.created = created
        top = self._top
        for key, value in event.items():
            if key not in _TOP_OWN and top.get(key) is None:
                top[key] = value
        if "error" in event:
            self.error = True
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        finish = choice.get("finish_reason")
        if isinstance(finish, str):
            self.finish_reason = finish
        plain = True  # nothing but one text (and fields the first instance of sets)
        for key, value in choice.items():
            if key not in _CHOICE_OWN:
                _merge(self._choice, key, value, concat=False)
                plain = plain and value is None
        delta = choice.get("delta") if self.endpoint == "chat" else choice
        if not isinstance(delta, dict):
            return
        texts: list[str] = []
        for key, value in delta.items():
            if key in self._fields and isinstance(value, str):
                self._texts.setdefault(key, []).append(orjson.dumps(value))
                if value:
                    texts.append(key)
            elif self.endpoint == "chat":
                _merge(self._message, key, value, concat=True)
                plain = plain and (value is None or key in _KEPT_FIRST)
        if not texts:
            return
        self.chunks += 1
        if (
            plain
            and len(texts) == 1
            and finish is None
            and usage is None
            and "error" not in event
            and len(choices) == 1
        ):
            # A plain delta that had to be parsed is shaped unlike the template (the first
            # one often carries the role too): the latest shape is the likeliest next.
            template = DeltaTemplate.of(payload, event, texts[0])
            self._template = template or self._template

    def _text(self) -> dict[str, str]:
        """The texts so far, per field: the kept string tokens decoded in one call (an
        invalid one marks the stream malformed and is left out)."""
        joined: dict[str, str] = {}
        for key, tokens in self._texts.items():
            strings = decoded_tokens(tokens)
            if strings is None:
                strings = []
                for token in tokens:
                    one = decoded_tokens([token])
                    if one is None:
                        self.malformed = True
                    else:
                        strings.extend(one)
            joined[key] = text = "".join(strings)
            tokens[:] = [orjson.dumps(text)] if tokens else []
        return joined

    def body(
        self,
        *,
        prompt_tokens: int,
        finish_reason: str | None = None,
        fallback_id: str = "",
        fallback_model: str = "",
    ) -> bytes:
        """The non-streaming answer, from every whole event read (``finish_reason``
        overrides the stream's own; the fallbacks stand in for an ``id``/``model`` the
        stream never sent)."""
        self._digest()
        texts = self._text()
        reason = finish_reason or self.finish_reason or "stop"
        choice: dict[str, object]
        if self.endpoint == "chat":
            message: dict[str, object] = {"role": "assistant", "content": ""}
            message.update(self._message)  # a null content (tool calls only) stays null
            message.update(texts)
            calls = message.get("tool_calls")
            if isinstance(calls, list):  # a streamed call's index is not in the answer's
                message["tool_calls"] = [_unindexed(call) for call in calls]
            choice = {"index": 0, "message": message, **self._choice, "finish_reason": reason}
            kind = "chat.completion"
        else:
            text = texts.get("text", "")
            choice = {"index": 0, "text": text, **self._choice, "finish_reason": reason}
            kind = "text_completion"
        usage = self.usage
        if usage is None or finish_reason is not None:
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": self.chunks,
                "total_tokens": prompt_tokens + self.chunks,
            }
        body = {
            "id": self.id or fallback_id,
            "object": kind,
            "created": self.created,
            "model": self.model or fallback_model,
            **self._top,
            "choices": [choice],
            "usage": usage,
        }
        return orjson.dumps(body)
