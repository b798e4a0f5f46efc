"""Fixtures for tests against real inference engines serving a tiny GGUF that the tests
write themselves, with sluicegate in front: llama-cpp-python's server and llama.cpp's own
``llama-server``.

Each engine is started once per session (``llama_engine``, ``llama_cpp``); each
test starts its own gateway in a thread (``gateway_for``,
``gateway_for_llama_cpp``). llama-cpp-python's test modules skip, saying why,
when it is not installed; llama-server's fail when its binary is missing,
saying how to build it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.gateway_harness import Stack
from tests.realengine.llama_cpp_server import (
    LlamaCppServer,
    llama_cpp_server,
    llama_server_gateway,
)
from tests.realengine.llama_server import LlamaServer, llama_server, require_llama_cpp
from tests.realengine.realengine_client import wait_engine_idle
from tests.realengine.realengine_stack import GatewayFactory, gateway_on

IDLE_WAIT_S = 30.0


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny GGUF, written once per session."""
    require_llama_cpp()
    from tests.realengine.tiny_gguf import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("realengine") / "tiny.gguf")


@pytest.fixture(scope="session")
def llama_engine(tiny_model: Path) -> Iterator[LlamaServer]:
    """The real engine, once per session, with ``--interrupt_requests false``."""
    require_llama_cpp()
    with llama_server(tiny_model, tiny_model.with_suffix(".log")) as server:
        yield server


@pytest.fixture
def gateway_for(llama_engine: LlamaServer) -> GatewayFactory:
    """Start a gateway in front of the session's engine: ``with gateway_for(body) as gw``."""

    def start(body: str = "", **options: Any) -> AbstractContextManager[Stack]:
        return gateway_on(llama_engine.port, body, **options)

    return start


@pytest.fixture(scope="session")
def llama_server_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny GGUF for llama-server (which needs no llama-cpp-python), once per session."""
    from tests.realengine.tiny_gguf import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("llama-server") / "tiny.gguf")


@pytest.fixture(scope="session")
def llama_cpp(llama_server_model: Path) -> Iterator[LlamaCppServer]:
    """llama.cpp's own server, once per session: ``--parallel 4``, 8192 tokens of context
    (2048 per slot, the tiny model's training context), ``--metrics --slots``."""
    log = llama_server_model.with_name("llama-server.log")
    with llama_cpp_server(llama_server_model, parallel=4, ctx=8192, log=log) as server:
        yield server


@pytest.fixture
def gateway_for_llama_cpp(llama_cpp: LlamaCppServer) -> GatewayFactory:
    """Start a gateway in front of the session's llama-server (``engine: llama-server``,
    ``max_concurrency: 4`` unless given): ``with gateway_for_llama_cpp(body) as gw``."""

    def start(body: str = "", **options: Any) -> AbstractContextManager[Stack]:
        return llama_server_gateway([llama_cpp.port], body, **options)

    return start


@pytest.fixture(autouse=True)
def _engine_left_idle(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used an engine, wait (bounded) until the engine is idle, so a
    request a test left running never delays the next test's timings."""
    yield
    if "llama_engine" in request.fixturenames:
        engine: LlamaServer = request.getfixturevalue("llama_engine")
        wait_engine_idle(engine.url, IDLE_WAIT_S)
    if "llama_cpp" in request.fixturenames:
        server: LlamaCppServer = request.getfixturevalue("llama_cpp")
        server.wait_idle(IDLE_WAIT_S)
