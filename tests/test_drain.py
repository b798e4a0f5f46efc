"""``sluicegate drain`` (a Kubernetes preStop hook), run as the real command against a real
gateway: it stops admission, waits for running work to finish, and reports how it ended in
its exit status (0 idle, 3 still busy, 1 could not drain)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from sluicegate.config import load_config
from sluicegate.gateway.app import build_app
from tests.gateway.gateway_harness import (
    FAST_PRIORS,
    MODEL,
    Reply,
    assert_retry_headers,
    engine_config,
    engine_server,
    http_call,
    openai_error,
    start_server,
    stop_servers,
    unused_port,
    wait_until,
)

SLUICEGATE = Path(sys.executable).with_name("sluicegate")
KEY_ENV = "DRAIN_TEST_ADMIN_KEY"
ADMIN = "drain-admin-canary-6d1f"
# ~10 ms per decode step: a 120-token answer takes about 1.2 s.
SLOW_ENGINE = engine_config(base_s=0.01)
SLOW_TOKENS = 120


@dataclass(frozen=True)
class Gateway:
    """A gateway on a known port, the config file it was built from, and its URL."""

    config_path: Path
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def _gateway(tmp_path: Path, max_concurrency: int = 4) -> Iterator[Gateway]:
    """A slow emulated engine and a gateway configured by a file naming its port and its
    admin key's variable (``KEY_ENV``), as a pod's config would."""
    with engine_server(SLOW_ENGINE) as engine:
        port = unused_port()
        path = tmp_path / "sluicegate.yaml"
        path.write_text(
            f"server: {{port: {port}, admin_key_env: {KEY_ENV}}}\n"
            f"models:\n  - name: {MODEL}\n    max_concurrency: {max_concurrency}\n"
            f"    backends: [{{name: e0, url: '{engine.url}', engine: emulator}}]\n"
            f"{FAST_PRIORS}"
        )
        app = build_app(load_config(path), environ={KEY_ENV: ADMIN})
        running = start_server(app, port)
        try:
            yield Gateway(path, running.port)
        finally:
            stop_servers([running])


def _drain(*args: str, key: str | None = ADMIN) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (KEY_ENV, "SLUICEGATE_ADMIN_KEY")}
    if key is not None:
        env[KEY_ENV] = key
    return subprocess.run(
        [str(SLUICEGATE), "drain", *args],
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


@dataclass
class _Slow:
    """A slow completion sent from a thread, and when its answer arrived (monotonic)."""

    reply: Reply | None = None
    answered_at: float = 0.0


def _start_slow(
    gateway: Gateway, tokens: int, *, running: int = 1, queued: int = 0
) -> tuple[_Slow, threading.Thread]:
    """Send a slow completion; return once the gateway shows ``running`` and ``queued``."""
    slow = _Slow()
    body = {"model": MODEL, "prompt": "slow", "max_tokens": tokens, "ignore_eos": True}

    def run() -> None:
        slow.reply = http_call(gateway.base_url, "POST", "/v1/completions", json=body, timeout=30)
        slow.answered_at = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def shows() -> bool:
        model = _state(gateway).json()["models"][0]
        return bool(model["running"] == running and model["queued"] == queued)

    assert wait_until(shows, 5)
    return slow, thread


def _small(gateway: Gateway) -> Reply:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "ignore_eos": True}
    return http_call(gateway.base_url, "POST", "/v1/completions", json=body)


def _state(gateway: Gateway, key: str = ADMIN) -> Reply:
    return http_call(gateway.base_url, "GET", "/admin/state", key=key)


def test_drain_returns_after_the_running_request_finished(tmp_path: Path) -> None:
    """With a ~1.2 s request running, ``drain --config`` (port and key variable from the
    file) exits 0 saying ``drained`` only after that request was answered 200 in full, and
    within a poll (0.5 s) plus start-up of it; afterwards ``/readyz`` is 503 ``draining``
    and a new request 503 ``draining`` with Retry-After."""
    with _gateway(tmp_path) as gateway:
        slow, thread = _start_slow(gateway, SLOW_TOKENS)
        result = _drain("--config", str(gateway.config_path), "--wait-s", "15")
        drained_at = time.monotonic()
        thread.join(5)
        assert result.returncode == 0, result
        assert "drained" in result.stdout, result
        assert slow.reply is not None
        assert slow.reply.status == 200, slow.reply
        assert slow.reply.json()["usage"]["completion_tokens"] == SLOW_TOKENS
        assert slow.answered_at <= drained_at
        assert drained_at - slow.answered_at < 2.0

        ready = http_call(gateway.base_url, "GET", "/readyz")
        assert (ready.status, ready.json()) == (503, {"status": "draining"})
        refused = _small(gateway)
        assert refused.status == 503
        assert openai_error(refused)["code"] == "draining"
        assert_retry_headers(refused)
        assert _state(gateway).json()["draining"] is True


def test_drain_waits_for_queued_requests_too(tmp_path: Path) -> None:
    """One slot: a running and a queued request (~0.6 s each). Drain lets the queued one be
    admitted and finish (both answered 200 in full) before it exits 0."""
    with _gateway(tmp_path, max_concurrency=1) as gateway:
        first, first_thread = _start_slow(gateway, 60)
        second, second_thread = _start_slow(gateway, 60, running=1, queued=1)
        result = _drain("--config", str(gateway.config_path), "--wait-s", "15")
        drained_at = time.monotonic()
        first_thread.join(5)
        second_thread.join(5)
        assert result.returncode == 0, result
        for slow in (first, second):
            assert slow.reply is not None
            assert slow.reply.status == 200, slow.reply
            assert slow.reply.json()["usage"]["completion_tokens"] == 60
            assert slow.answered_at <= drained_at
        assert first.answered_at < second.answered_at


def test_drain_of_an_idle_gateway_returns_at_once(tmp_path: Path) -> None:
    """Nothing running: ``drain --url --admin-key-env`` exits 0 after one look, and the
    gateway is draining."""
    with _gateway(tmp_path) as gateway:
        started = time.monotonic()
        result = _drain("--url", gateway.base_url, "--admin-key-env", KEY_ENV, "--wait-s", "5")
        assert result.returncode == 0, result
        assert "drained: idle after 0.0 s" in result.stdout, result
        assert time.monotonic() - started < 3.0
        assert _state(gateway).json()["draining"] is True


def test_drain_gives_up_after_wait_s_with_exit_3(tmp_path: Path) -> None:
    """A request far longer than ``--wait-s 0.5``: drain exits 3 after about 0.5 s, saying
    what is still running; the request itself goes on to complete."""
    with _gateway(tmp_path) as gateway:
        slow, thread = _start_slow(gateway, 400)  # ~4 s
        started = time.monotonic()
        result = _drain("--config", str(gateway.config_path), "--wait-s", "0.5")
        took = time.monotonic() - started
        assert result.returncode == 3, result
        assert "still busy" in result.stdout, result
        assert "0 queued, 1 running" in result.stdout, result
        assert took < 3.0, took
        assert slow.reply is None  # still running when drain gave up
        thread.join(10)
        assert slow.reply is not None
        assert slow.reply.status == 200


@pytest.mark.parametrize("how", ["--config", "--url"])
def test_a_wrong_admin_key_exits_1_without_printing_it(tmp_path: Path, how: str) -> None:
    """A wrong key: exit 1, a message saying the key was refused, neither key in the output,
    and the gateway goes on admitting (not draining)."""
    wrong = "wrong-key-canary-91ab"
    with _gateway(tmp_path) as gateway:
        where = str(gateway.config_path) if how == "--config" else gateway.base_url
        extra = () if how == "--config" else ("--admin-key-env", KEY_ENV)
        result = _drain(how, where, *extra, "--wait-s", "1", key=wrong)
        output = result.stdout + result.stderr
        assert result.returncode == 1, result
        assert "refused the admin key" in output, output
        assert wrong not in output, output
        assert ADMIN not in output, output
        assert _state(gateway).json()["draining"] is False
        assert _small(gateway).status == 200


def test_an_unset_key_variable_exits_1_naming_the_variable(tmp_path: Path) -> None:
    """The config's key variable unset: exit 1 naming the variable; nothing drains."""
    with _gateway(tmp_path) as gateway:
        result = _drain("--config", str(gateway.config_path), key=None)
        assert result.returncode == 1, result
        assert KEY_ENV in result.stderr, result
        assert _state(gateway).json()["draining"] is False


def test_an_unreachable_gateway_exits_1() -> None:
    """Nothing listening on the port: exit 1 saying it cannot reach the gateway."""
    url = f"http://127.0.0.1:{unused_port()}"
    result = _drain("--url", url, "--admin-key-env", KEY_ENV, "--wait-s", "1")
    assert result.returncode == 1, result
    assert "cannot reach the gateway" in result.stderr, result
    assert ADMIN not in result.stdout + result.stderr


def test_a_bad_config_file_exits_1_naming_the_problem(tmp_path: Path) -> None:
    """``--config`` naming an invalid file: exit 1 with the config error, no traceback."""
    path = tmp_path / "bad.yaml"
    path.write_text("server: {port: -3}\nmodels: [{name: m}]\n")
    result = _drain("--config", str(path))
    assert result.returncode == 1, result
    assert "server.port (line 1)" in result.stderr, result
    assert "Traceback" not in result.stderr, result


def test_drain_cancel_undoes_a_drain(tmp_path: Path) -> None:
    """``drain`` then ``drain --cancel``: exit 0 saying ``undrained``; ``/readyz`` is 200 again,
    a new request is served, and ``/admin/state`` says not draining. A second ``--cancel`` (of
    a gateway that admits) is harmless."""
    with _gateway(tmp_path) as gateway:
        assert _drain("--config", str(gateway.config_path), "--wait-s", "5").returncode == 0
        assert http_call(gateway.base_url, "GET", "/readyz").status == 503
        assert _small(gateway).status == 503
        for _ in range(2):
            result = _drain("--config", str(gateway.config_path), "--cancel")
            assert result.returncode == 0, result
            assert "undrained" in result.stdout, result
        ready = http_call(gateway.base_url, "GET", "/readyz")
        assert (ready.status, ready.json()) == (200, {"status": "ready"})
        assert _small(gateway).status == 200
        assert _state(gateway).json()["draining"] is False


def test_drain_cancel_with_a_wrong_key_exits_1_and_stays_drained(tmp_path: Path) -> None:
    """``--cancel`` with a wrong key: exit 1 saying the key was refused (never printing it);
    the gateway stays drained."""
    wrong = "wrong-cancel-canary-5e0a"
    with _gateway(tmp_path) as gateway:
        assert _drain("--config", str(gateway.config_path), "--wait-s", "5").returncode == 0
        result = _drain("--config", str(gateway.config_path), "--cancel", key=wrong)
        output = result.stdout + result.stderr
        assert result.returncode == 1, result
        assert "refused the admin key" in output, output
        assert wrong not in output
        assert _state(gateway).json()["draining"] is True
