"""Fuzz target: any engine stream, cut into any chunks → SseScanner and StreamAssembler cope.

The bytes an engine sends are fed, in fuzzer-chosen chunks, to the gateway's
stream accounting (``sse.SseScanner``) and to the non-streaming reassembly
(``assemble.StreamAssembler``). Neither may raise (they document no exception),
what they conclude must not depend on how the stream was chunked, and the
reassembled body must be a JSON object in OpenAI's shape. ``streamable_copy``
gets the same bytes as a request body: ``None`` or a JSON object that streams.

Run: ``python fuzz/fuzz_sse.py [corpus_dir] -max_total_time=600`` (see fuzz/README.md).
"""

from __future__ import annotations

import random
import sys

import atheris  # type: ignore[import-untyped]

with atheris.instrument_imports(include=["sluicegate"]):
    import orjson

    from sluicegate.gateway.assemble import StreamAssembler, streamable_copy
    from sluicegate.gateway.classify import Endpoint
    from sluicegate.gateway.sse import SseScanner

ENDPOINTS: tuple[Endpoint, ...] = ("chat", "completions")
FINISH = (None, "preempted")


def _scan(chunks: list[bytes], endpoint: Endpoint) -> tuple[SseScanner, StreamAssembler]:
    scanner, assembler = SseScanner(), StreamAssembler(endpoint)
    for chunk in chunks:
        assert scanner.feed(chunk) >= 0
        assembler.feed(chunk)
    return scanner, assembler


def _summary(scanner: SseScanner, assembler: StreamAssembler) -> tuple[object, ...]:
    return (
        scanner.chunks, scanner.done, scanner.error, scanner.finish_reason,
        scanner.prompt_tokens, scanner.completion_tokens, assembler.parts,
        assembler.finish_reason, assembler.usage, assembler.id, assembler.model, assembler.done,
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


def TestOneInput(data: bytes) -> None:  # noqa: N802 - the name atheris calls
    """One input: a stream, its chunking, the endpoint and a finish-reason override."""
    if len(data) < 2:
        return
    endpoint, finish, prompt_tokens, chunks, stream = _split(data)
    scanner, assembler = _scan(chunks, endpoint)
    whole = _scan([stream], endpoint)
    assert _summary(scanner, assembler) == _summary(*whole), "depends on the chunking"
    assert scanner.chunks >= 0

    body = orjson.loads(assembler.body(prompt_tokens=prompt_tokens, finish_reason=finish))
    assert isinstance(body, dict)
    choice = body["choices"][0]
    assert choice["finish_reason"] == (finish or assembler.finish_reason or "stop")
    text = choice["message"]["content"] if endpoint == "chat" else choice["text"]
    assert text == "".join(assembler.parts)

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
