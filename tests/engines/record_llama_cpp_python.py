"""Record llama-cpp-python's server's answers for the conformance fixtures
(``fixtures/llamacpp/``).

Run by hand, not by the suite: ``PYTHONPATH=src:. python -m
tests.engines.record_llama_cpp_python [folder]``. It starts ``python -m llama_cpp.server``
with the real-engine tests' helper (tests/realengine/llama_server.py: the tiny GGUF,
4096 tokens of context) and saves, as the server sent them:

- ``health.json``: ``GET /health`` (it has no such route: FastAPI's 404 while it serves);
- ``errors-recorded.json``: a prompt past the context, a request FastAPI refuses (422),
  and a prompt past the context in a stream;
- ``normal.sse``, ``usage.sse`` (``stream_options.include_usage``, which it ignores),
  ``completions.sse``, ``error.sse`` (a stream whose prompt is past the context: the
  server has sent its headers when the error is raised, and the connection just ends) and
  ``abort.sse`` (what a client had read when it closed the stream).
"""

from __future__ import annotations

import http.client
import json
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

from tests.realengine.llama_server import LlamaServer
from tests.realengine.tiny_gguf import write_tiny_gguf

FIXTURES = Path(__file__).with_name("fixtures") / "llamacpp"
CHAT = "/v1/chat/completions"
ABORT_AFTER_EVENTS = 6
LONG = "hi " * 5000


def _request(port: int, method: str, path: str, body: object = None) -> tuple[int, bytes]:
    """Status and body; a body cut short is returned as far as it came."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        data = None if body is None else json.dumps(body).encode()
        connection.request(method, path, data, {"Content-Type": "application/json"})
        response = connection.getresponse()
        try:
            return response.status, response.read()
        except http.client.IncompleteRead as cut:
            return response.status, cut.partial
    finally:
        connection.close()


def _aborted_stream(port: int) -> bytes:
    """The events a client had read when it closed a long stream."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    request = {"messages": [{"role": "user", "content": "tell"}], "max_tokens": 1000}
    connection.request("POST", CHAT, json.dumps({**request, "stream": True}).encode(),
                       {"Content-Type": "application/json"})  # fmt: skip
    response = connection.getresponse()
    read = b""
    while read.count(b"\r\n\r\n") + read.count(b"\n\n") < ABORT_AFTER_EVENTS:
        read += response.read1(1)
    connection.close()
    return read


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def record(folder: Path) -> None:
    """Start llama-cpp-python's server and write every recording into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    with TemporaryDirectory() as scratch:
        model = write_tiny_gguf(Path(scratch) / "tiny.gguf")
        server = LlamaServer(model, Path(scratch) / "server.log")
        server.start()
        try:
            port = server.port
            status, body = _request(port, "GET", "/health")
            _write_json(folder / "health.json", {"status": status, "body": json.loads(body)})
            errors = []
            for name, path, request in (
                ("context", CHAT, {"messages": [{"role": "user", "content": LONG}],
                                   "max_tokens": 5}),
                ("context_completion", "/v1/completions", {"prompt": LONG, "max_tokens": 5}),
                ("shape", CHAT, {"messages": "not a list"}),
            ):  # fmt: skip
                status, body = _request(port, "POST", path, request)
                errors.append({"case": name, "status": status, "body": json.loads(body)})
            _write_json(folder / "errors-recorded.json", errors)
            chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
            streams = {
                "normal.sse": (CHAT, chat),
                "usage.sse": (CHAT, {**chat, "stream_options": {"include_usage": True}}),
                "completions.sse": ("/v1/completions", {"prompt": "hi", "max_tokens": 6}),
                "error.sse": (CHAT, {"messages": [{"role": "user", "content": LONG}],
                                     "max_tokens": 5}),
            }  # fmt: skip
            for name, (path, request) in streams.items():
                status, body = _request(port, "POST", path, {**request, "stream": True})
                assert status == 200, (name, status, body)
                (folder / name).write_bytes(body)
            (folder / "abort.sse").write_bytes(_aborted_stream(port))
        finally:
            server.stop()


if __name__ == "__main__":
    record(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURES)
