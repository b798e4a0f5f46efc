"""llama-cpp-python's OpenAI server as a real subprocess on loopback, for the real-engine tests.

The server loads one GGUF under the alias ``tiny`` (the harness's model name)
and serves one request at a time. It is ready once ``GET /v1/models``
answers; its output goes to a log file whose tail is shown if it fails to
start.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.gateway.gateway_harness import MODEL, unused_port
from tests.realengine.engine_process import answers_200, start_engine, stop_engine

# The tiny model streams ~3 ms a token, so 512 tokens of context would be over in ~1.5 s:
# too short to show that a disconnect frees the engine. 4096 allows ~12 s streams.
N_CTX = 4096
SKIP_REASON = (
    "the real-engine tests need llama-cpp-python[server] and gguf, which are not installed; "
    "the engine-tests extra builds them (pip install -e '.[dev,engine-tests]', or make test)"
)


def require_llama_cpp() -> None:
    """Skip the calling test module, saying why, unless llama-cpp-python is installed.

    Looked up rather than imported: importing ``llama_cpp`` opens files it never
    closes, which this process would report as ResourceWarnings at exit; the
    server runs in its own process anyway.
    """
    if any(importlib.util.find_spec(name) is None for name in ("llama_cpp", "gguf")):
        pytest.skip(SKIP_REASON, allow_module_level=True)


@dataclass
class LlamaServer:
    """One ``python -m llama_cpp.server`` process that a test can stop and start again.

    Every start uses the same port, so a gateway configured with its URL
    finds it again after a restart.
    """

    model: Path
    log: Path
    interrupt_requests: bool = False
    port: int = 0
    _process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The command line (the issue's, with the port and interrupt setting filled in)."""
        return [
            sys.executable, "-m", "llama_cpp.server", "--model", str(self.model),
            "--model_alias", MODEL, "--host", "127.0.0.1", "--port", str(self.port),
            "--n_ctx", str(N_CTX),
            "--interrupt_requests", "true" if self.interrupt_requests else "false",
        ]  # fmt: skip

    def start(self) -> None:
        """Start the server and wait until it answers; RuntimeError with its log if it dies."""
        assert self._process is None, "already running"
        self.port = self.port or unused_port()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # its access log, line by line
        name = "llama_cpp.server"
        self._process = start_engine(self.command(), self.log, self._answers, name, env)

    def _answers(self) -> bool:
        return answers_200(self.url + "/v1/models")

    def stop(self) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after 10 s) and reap it."""
        process, self._process = self._process, None
        stop_engine(process)

    def requests_logged(self, method_and_path: str) -> int:
        """How many requests for ``method_and_path`` (e.g. ``GET /metrics``) the server has
        logged so far (uvicorn's access log)."""
        return self.log.read_text(errors="replace").count(f'"{method_and_path} HTTP/1.1"')

    def cpu_s(self) -> float:
        """CPU seconds the server process has used (user + system, from /proc on Linux)."""
        assert self._process is not None, "not running"
        fields = Path(f"/proc/{self._process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def llama_server(
    model: Path, log: Path, *, interrupt_requests: bool = False
) -> Iterator[LlamaServer]:
    """A started :class:`LlamaServer`, stopped on exit whatever state it was left in."""
    server = LlamaServer(model, log, interrupt_requests=interrupt_requests)
    server.start()
    try:
        yield server
    finally:
        server.stop()
