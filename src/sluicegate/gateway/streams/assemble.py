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
it, for every choice (``n`` > 1): see ``gateway/streams/assemble_fields.py``.
"""

from __future__ import annotations

import time

import orjson

from sluicegate.gateway.streams.assemble_fields import (
    CHOICE_OWN,
    COUNTS,
    TEXT_FIELDS,
    TOP_OWN,
    ChoiceParts,
    added_usage,
    checked_usage,
    merge,
)
from sluicegate.gateway.streams.delta_template import DeltaTemplate
from sluicegate.gateway.streams.endpoint_kind import Endpoint
from sluicegate.gateway.streams.scanner import DONE
from sluicegate.gateway.streams.sse import SseSplitter, payloads_of

DIGEST_BYTES = 16 * 1024
MAX_CHOICES = 128
"""Choice indexes kept apart; a larger one (the gateway allows ``n`` ≤ 16) joins choice 0."""

# Fields whose streamed form this assembler does not merge: such requests are
# forwarded untouched instead (tool calls and log probabilities an engine streams in
# its own ways; they are merged when they come, but not asked for).
UNMERGED_FIELDS = ("tools", "functions", "logprobs", "top_logprobs", "tool_choice")


def streamable_copy(raw: bytes) -> bytes | None:
    """``raw`` rewritten to stream with usage, or ``None`` if its answer can't be rebuilt."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict):
        return None
    if any(field in body for field in UNMERGED_FIELDS):
        return None
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    try:
        return orjson.dumps(body)
    except TypeError:  # nested deeper than orjson writes
        return None


class StreamAssembler:
    """Reads an OpenAI event stream and builds the non-streaming answer it amounts to.

    ``feed`` each read of the stream and ``close`` at its end; ``done``, ``error``
    (the engine sent an error event) and ``malformed`` (an event that is not a JSON
    object, or an unfinished one past the size cap) tell how it went, as far as the
    stream has been read into events; ``body`` builds the answer.
    """

    __slots__ = (
        "_choices",
        "_fields",
        "_held",
        "_held_bytes",
        "_held_events",
        "_inline_usage",
        "_splitter",
        "_template",
        "_top",
        "chunks",
        "created",
        "done",
        "endpoint",
        "error",
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
        self._choices: dict[int, ChoiceParts] = {0: ChoiceParts()}  # by index
        self._top: dict[str, object] = {}  # the chunks' other top-level fields
        self.chunks = 0  # content chunks (non-empty texts) read so far
        self.done = False
        self.error = False
        self.malformed = False
        self.usage: dict[str, object] | None = None  # the usage chunks' (added up)
        # Usage sent beside choices, per choice index: each choice's so far.
        self._inline_usage: dict[int, dict[str, object]] = {}
        self.id = ""
        self.model = ""

    @property
    def overflowed(self) -> bool:
        """Whether an event went over the splitter's cap (``sse.MAX_EVENT_BYTES``)."""
        return self._splitter.overflowed

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
                self._choices[template.index].texts[template.key].extend(tokens)
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
        tokens = None if template is None else self._tokens_of(template)
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
                    tokens = None if template is None else self._tokens_of(template)

    def _tokens_of(self, template: DeltaTemplate) -> list[bytes]:
        return self._choices[template.index].texts[template.key]

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
        created = event.get("created")
        if type(created) is int and created >= 0:
            self.created = created
        top = self._top
        for key, value in event.items():
            if key not in TOP_OWN and top.get(key) is None:
                top[key] = value
        if "error" in event or event.get("object") == "error":  # nested, or vLLM < 0.10's
            self.error = True
        choices = event.get("choices")
        if isinstance(usage, dict):
            beside = None  # a usage chunk (no choices)
            if isinstance(choices, list) and choices and isinstance(choices[0], dict):
                beside = choices[0].get("index")
                beside = beside if type(beside) is int else 0
            self._keep_usage(usage, beside)
        if not isinstance(choices, list):
            return
        plain_key: str | None = None
        for choice in choices:
            if isinstance(choice, dict):
                plain_key = self._parse_choice(choice)
        if plain_key is not None and len(choices) == 1 and usage is None and "error" not in event:
            # A plain delta that had to be parsed is shaped unlike the template (the first
            # one often carries the role too): the latest shape is the likeliest next.
            index = choices[0].get("index")
            index = index if type(index) is int else 0
            template = DeltaTemplate.of(payload, event, plain_key, index)
            self._template = template or self._template

    def _parse_choice(self, choice: dict[str, object]) -> str | None:
        """Keep one streamed choice; the text field it alone carries, if it is plain (no
        finish and nothing else to merge but a role), else None."""
        index = choice.get("index")
        index = index if type(index) is int and 0 <= index < MAX_CHOICES else 0
        parts = self._choices.get(index)
        if parts is None:
            parts = self._choices[index] = ChoiceParts()
        finish = choice.get("finish_reason")
        plain = finish is None
        if isinstance(finish, str):
            parts.finish_reason = finish
        for key, value in choice.items():
            if key not in CHOICE_OWN:
                merge(parts.own, key, value, concat=False)
                plain = plain and value is None
        chat = self.endpoint == "chat"
        delta = choice.get("delta") if chat else choice
        if not isinstance(delta, dict):
            return None
        texts: list[str] = []
        for key, value in delta.items():
            if key in self._fields:
                if isinstance(value, str):
                    parts.texts.setdefault(key, []).append(orjson.dumps(value))
                    if value:
                        texts.append(key)
                elif value is None and chat:  # a null content (tool calls only) stays null
                    parts.message.setdefault(key, None)
                else:
                    plain = False  # not text: left out
            elif chat:
                merge(parts.message, key, value, concat=True)
                plain = plain and (value is None or key == "role")
        if not texts:
            return None
        self.chunks += 1
        return texts[0] if plain and len(texts) == 1 else None

    def _keep_usage(self, usage: dict[str, object], beside: int | None) -> None:
        """Usage chunks (``beside`` None) add up: one for the whole answer (vLLM), or one
        per choice (llama.cpp's server, chat). Usage beside choice ``beside`` is that
        choice's so far (vLLM's continuous usage, llama.cpp's server on a completion's
        last chunk of each choice): the latest per choice, added over the choices when
        no usage chunk came (``SseScanner`` counts alike)."""
        checked = checked_usage(usage)
        if checked is None:
            return
        if beside is not None:
            self._inline_usage[beside] = checked
        elif self.usage is None:
            self.usage = checked
        else:
            self.usage = added_usage(self.usage, checked)

    def _text(self) -> dict[int, dict[str, str]]:
        """The texts so far, per choice and field: the kept string tokens decoded (an
        invalid one marks the stream malformed and is left out)."""
        joined = {}
        for index, parts in self._choices.items():
            joined[index], bad = parts.joined()
            self.malformed = self.malformed or bad
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
        try:
            return self._dumped(texts, prompt_tokens, finish_reason, fallback_id, fallback_model)
        except TypeError:
            # An engine's field nested deeper than orjson writes (it reads 1024 levels,
            # writes 255): the answer without the fields the assembler does not read.
            return self._dumped(
                texts, prompt_tokens, finish_reason, fallback_id, fallback_model, bare=True
            )

    def _dumped(
        self,
        texts: dict[int, dict[str, str]],
        prompt_tokens: int,
        finish_reason: str | None,
        fallback_id: str,
        fallback_model: str,
        *,
        bare: bool = False,
    ) -> bytes:
        chat = self.endpoint == "chat"
        choices = [
            parts.body(
                index, texts[index], finish_reason or parts.finish_reason or "stop", chat, bare=bare
            )
            for index, parts in sorted(self._choices.items())
        ]
        kind = "chat.completion" if chat else "text_completion"
        usage = self.usage
        if usage is None and self._inline_usage:
            beside = list(self._inline_usage.values())
            usage = beside[0]
            for more in beside[1:]:
                usage = added_usage(usage, more)
        if usage is not None and bare:
            usage = {name: value for name, value in usage.items() if name in COUNTS}
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
            **({} if bare else self._top),
            "choices": choices,
            "usage": usage,
        }
        return orjson.dumps(body)
