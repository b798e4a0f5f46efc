"""``sluicegate check-config --connect`` against a real ``redis-server``."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from sluicegate.cli import app
from tests.store.redis_server import running_redis

runner = CliRunner()


def _config(tmp_path: Path, store: str) -> Path:
    path = tmp_path / "sluicegate.yaml"
    path.write_text(f"models: [{{name: m}}]\nstore: {store}\ndistributed: {{timeout_ms: 200}}\n")
    return path


def test_connect_reports_the_round_trip(tmp_path: Path) -> None:
    """A reachable store: exit 0 with the measured round trip."""
    with running_redis() as redis:
        url = f"redis://127.0.0.1:{redis.port}/0"
        result = runner.invoke(app, ["check-config", str(_config(tmp_path, url)), "--connect"])
    assert result.exit_code == 0, result.output
    assert re.search(r"store reachable: round trip \d+\.\d\d ms", result.output)


def test_connect_with_wrong_credentials_fails_without_showing_them(tmp_path: Path) -> None:
    """A store refusing the credentials: exit 1 naming the cause; the password is not shown
    (the URL is printed without user name and password)."""
    with running_redis() as redis:
        url = f"redis://user:hunter2@127.0.0.1:{redis.port}/0"
        result = runner.invoke(app, ["check-config", str(_config(tmp_path, url)), "--connect"])
    assert result.exit_code == 1
    assert "AuthenticationError" in result.output
    assert f"store redis://127.0.0.1:{redis.port}/0" in result.output
    assert "hunter2" not in result.output


def test_connect_to_nothing_fails_fast(tmp_path: Path) -> None:
    """An unreachable store: exit 1 saying so, without the password."""
    with running_redis() as redis:
        port = redis.port
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    result = runner.invoke(app, ["check-config", str(_config(tmp_path, url)), "--connect"])
    assert result.exit_code == 1
    assert "store: unreachable" in result.output
    assert "hunter2" not in result.output


def test_connect_with_the_memory_store_says_there_is_nothing_to_reach(tmp_path: Path) -> None:
    """With ``store: memory`` the flag has nothing to check, and says so."""
    path = tmp_path / "sluicegate.yaml"
    path.write_text("models: [{name: m}]\n")
    result = runner.invoke(app, ["check-config", str(path), "--connect"])
    assert result.exit_code == 0
    assert "nothing to reach" in result.output
