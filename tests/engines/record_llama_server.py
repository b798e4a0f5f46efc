"""Record llama-server's answers for the conformance fixtures (``fixtures/llama-server/``).

Run by hand, not by the suite (it needs the real binary; tests/realengine says how to
build it): ``PYTHONPATH=src:. python -m tests.engines.record_llama_server [folder]``.
It starts the binary with the real-engine tests' helpers (the tiny GGUF, ``--parallel 4``,
8192 tokens of context, ``--metrics``) and saves, as the engine sent them:

- ``health-loading.json`` / ``health-ready.json``: ``/health`` while the model loads (503)
  and once it is ready (200), each ``{"status", "body"}``;
- ``metrics-idle.prom``: ``/metrics`` after the load (``metrics.prom``, the page under
  load with 4 running and 4 deferred, was recorded earlier the same way and is kept);
- ``errors-recorded.json``: the error answers (a prompt past the context, an image part
  without ``--mmproj``, a request that is not OpenAI's shape, a body that is not JSON);
- ``normal.sse``, ``usage.sse`` (``stream_options.include_usage``), ``completions.sse``
  and ``abort.sse`` (what a client had read when it closed the stream).

Nothing is normalised: ids and timestamps are the engine's own.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from pathlib import Path
from tempfile import TemporaryDirectory

from tests.gateway.gateway_harness import unused_port
from tests.realengine.llama_cpp_server import LlamaCppServer
from tests.realengine.tiny_gguf import write_tiny_gguf

FIXTURES = Path(__file__).with_name("fixtures") / "llama-server"
CHAT = "/v1/chat/completions"
ABORT_AFTER_EVENTS = 6
TINY_PNG = "data:image/png;base64,iVBORw0KGgo="
ERROR_REQUESTS: dict[str, tuple[str, bytes]] = {
    "context": (CHAT, json.dumps({
        "messages": [{"role": "user", "content": "hi " * 5000}], "max_tokens": 5,
    }).encode()),
    "image": (CHAT, json.dumps({
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": TINY_PNG}}]}],
        "max_tokens": 5,
    }).encode()),
    "shape": (CHAT, json.dumps({"messages": "not a list"}).encode()),
    "not_json": (CHAT, b"{not json"),
}  # fmt: skip


def _connection(port: int) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", port, timeout=60)


def _get(port: int, path: str) -> tuple[int, bytes]:
    connection = _connection(port)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _post(port: int, path: str, body: bytes) -> http.client.HTTPResponse:
    connection = _connection(port)
    connection.request("POST", path, body, {"Content-Type": "application/json"})
    return connection.getresponse()


class HealthWatch:
    """Polls ``/health`` from before the process starts and keeps the first answer of
    each status."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.first: dict[int, bytes] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status, body = _get(self.port, "/health")
                self.first.setdefault(status, body)
            except OSError:
                pass
            time.sleep(0.001)

    def stop(self) -> None:
        """Stop polling."""
        self._stop.set()
        self._thread.join(timeout=5)


def _stream(port: int, path: str, request: dict[str, object]) -> bytes:
    response = _post(port, path, json.dumps({**request, "stream": True}).encode())
    assert response.status == 200, response.read()
    return response.read()


def _aborted_stream(port: int) -> bytes:
    """The events a client had read when it closed a long stream."""
    request = {"messages": [{"role": "user", "content": "tell"}], "max_tokens": 1000}
    response = _post(port, CHAT, json.dumps({**request, "stream": True}).encode())
    read = b""
    while read.count(b"\n\n") < ABORT_AFTER_EVENTS:
        read += response.read1(1)
    response.close()
    return read


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def record(folder: Path) -> None:
    """Start llama-server and write every recording into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    with TemporaryDirectory() as scratch:
        model = write_tiny_gguf(Path(scratch) / "tiny.gguf")
        port = unused_port()
        watch = HealthWatch(port)
        server = LlamaCppServer(model, Path(scratch) / "llama-server.log", port=port)
        server.start()
        try:
            watch.stop()
            for status, name in ((503, "loading"), (200, "ready")):
                body = watch.first.get(status)
                if body is None:
                    print(f"no /health answer of {status} was seen", file=sys.stderr)
                    continue
                _write_json(
                    folder / f"health-{name}.json", {"status": status, "body": json.loads(body)}
                )
            errors = []
            for name, (path, body) in ERROR_REQUESTS.items():
                response = _post(port, path, body)
                answer = json.loads(response.read())
                errors.append({"case": name, "status": response.status, "body": answer})
            _write_json(folder / "errors-recorded.json", errors)
            chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
            (folder / "normal.sse").write_bytes(_stream(port, CHAT, chat))
            usage = {**chat, "stream_options": {"include_usage": True}}
            (folder / "usage.sse").write_bytes(_stream(port, CHAT, usage))
            completion = {"prompt": "hi", "max_tokens": 6}
            (folder / "completions.sse").write_bytes(_stream(port, "/v1/completions", completion))
            (folder / "abort.sse").write_bytes(_aborted_stream(port))
            server.wait_idle(30)
            (folder / "metrics-idle.prom").write_bytes(server.get("/metrics"))
        finally:
            watch.stop()
            server.stop()


if __name__ == "__main__":
    record(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURES)
