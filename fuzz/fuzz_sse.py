"""Fuzz target: any engine stream, cut into any chunks → the SSE splitter, the scanner and the
reassembler cope.

The bytes an engine sends are fed, in fuzzer-chosen chunks, to the gateway's
framing (``sse.SseSplitter``), its stream accounting (``scanner.SseScanner``, as the
stream relay drives them) and the non-streaming reassembly
(``assemble.StreamAssembler``). None may raise (they document no exception); the
framing must hand on every byte exactly once (released plus held is the input,
and released bytes end at an event boundary); what they conclude must not depend
on how the stream was chunked; and the reassembled body must be a JSON object in
OpenAI's shape. ``streamable_copy`` gets the same bytes as a request body: ``None``
or a JSON object that streams.

Run: ``python fuzz/fuzz_sse.py [corpus_dir] -max_total_time=600`` (see fuzz/README.md).
"""

from __future__ import annotations

import random
import sys
from typing import Any

import atheris  # type: ignore[import-untyped]

with atheris.instrument_imports(include=["sluicegate"]):
    import orjson

    from sluicegate.gateway.request.classify import Endpoint
    from sluicegate.gateway.streams.assemble import StreamAssembler, streamable_copy
    from sluicegate.gateway.streams.scanner import SseScanner
    from sluicegate.gateway.streams.sse import SseSplitter

ENDPOINTS: tuple[Endpoint, ...] = ("chat", "completions")
FINISH = (None, "preempted")


class _Run:
    """One pass over the chunks: the relay's splitter and scanner, and a reassembler."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.splitter = SseSplitter()
        self.scanner = SseScanner()
        self.assembler = StreamAssembler(endpoint)
        self.released = b""
        self.payloads: list[bytes] = []
        self.first_outputs = 0

    def feed(self, chunk: bytes) -> None:
        whole, payloads = self.splitter.feed(chunk)
        self.released += whole
        if whole:
            assert _at_event_boundary(self.released), self.released[-8:]
        self.payloads += payloads
        self.scanner.scan_all(payloads)
        self.first_outputs += self.assembler.feed(chunk)
        assert self.first_outputs <= 1, "the first output was reported twice"

    def close(self) -> bytes:
        held, payloads = self.splitter.close()
        self.payloads += payloads
        self.scanner.scan_all(payloads)
        self.assembler.close()
        return held


def _at_event_boundary(released: bytes) -> bool:
    """Whether ``released`` ends with a blank line (LF or CRLF), where an event ends."""
    return released in (b"\n", b"\r\n") or released.endswith((b"\n\n", b"\n\r\n"))


def _run(chunks: list[bytes], endpoint: Endpoint) -> tuple[_Run, bytes]:
    run = _Run(endpoint)
    for chunk in chunks:
        run.feed(chunk)
    return run, run.close()


def _summary(run: _Run, body: dict[str, Any]) -> tuple[object, ...]:
    scanner, assembler = run.scanner, run.assembler
    return (
        run.payloads, run.splitter.overflowed, scanner.chunks, scanner.done, scanner.error,
        scanner.malformed, scanner.finish_reason, scanner.prompt_tokens,
        scanner.completion_tokens, assembler.chunks, assembler.done, assembler.error,
        assembler.malformed, {k: v for k, v in body.items() if k != "created"},
    )  # fmt: skip


def _split(data: bytes) -> tuple[Endpoint, str | None, int, list[bytes], bytes]:
    """Byte 0: endpoint, finish override, prompt tokens; byte 1 seeds where the stream is cut;
    the rest is the stream. (Plain bytes, so a seed file is two bytes and a real stream.)"""
    flags, seed, stream = data[0], data[1], data[2:]
    endpoint = ENDPOINTS[flags & 1]
    finish = FINISH[(flags >> 1) & 1]
    rng = random.Random(seed)
    cuts = sorted(rng.randrange(len(stream) + 1) for _ in range(seed % 9))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    return endpoint, finish, flags >> 2, chunks, stream


def _body(run: _Run, prompt_tokens: int, finish: str | None) -> dict[str, Any]:
    body = orjson.loads(run.assembler.body(prompt_tokens=prompt_tokens, finish_reason=finish))
    assert isinstance(body, dict)
    return body


def TestOneInput(data: bytes) -> None:  # noqa: N802 - the name atheris calls
    """One input: a stream, its chunking, the endpoint and a finish-reason override."""
    if len(data) < 2:
        return
    endpoint, finish, prompt_tokens, chunks, stream = _split(data)
    split, held = _run(chunks, endpoint)
    whole, _ = _run([stream], endpoint)
    if not split.splitter.overflowed:
        assert split.released + held == stream, "the framing lost or invented bytes"
    body = _body(split, prompt_tokens, finish)
    assert _summary(split, body) == _summary(whole, _body(whole, prompt_tokens, finish)), (
        "depends on the chunking"
    )
    assert split.scanner.chunks >= 0

    for choice in body["choices"]:
        reason = choice["finish_reason"]
        assert reason == finish if finish is not None else isinstance(reason, str) and reason
        if endpoint == "chat":
            message = choice["message"]
            assert isinstance(message["role"], str)
            # A null content is a tool-call-only answer's, as the engine sent it.
            assert isinstance(message["content"], str | None)
        else:
            assert isinstance(choice["text"], str)
    usage = body["usage"]
    assert isinstance(usage, dict)
    counts = [usage.get(name) for name in ("prompt_tokens", "completion_tokens", "total_tokens")]
    assert all(type(v) is int and v >= 0 for v in counts if v is not None), usage

    copy = streamable_copy(stream)
    if copy is not None:
        rewritten = orjson.loads(copy)
        assert rewritten["stream"] is True
        assert rewritten["stream_options"] == {"include_usage": True}


def main() -> None:
    """Run under libFuzzer with the command-line arguments (see fuzz/README.md)."""
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
