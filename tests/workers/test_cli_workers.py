"""``serve --workers``: what is refused before any process starts."""

from __future__ import annotations

import socket
from pathlib import Path

from typer.testing import CliRunner

from sluicegate.cli import app
from sluicegate.demo.processes import free_port
from tests.workers.fleet import write_config


def test_workers_below_one_is_refused(tmp_path: Path) -> None:
    """``--workers 0``: exit 2 and a message naming the option."""
    config = write_config(tmp_path, "g", port=free_port(), engine_port=free_port())
    result = CliRunner().invoke(app, ["serve", "-c", str(config), "--workers", "0"])
    assert result.exit_code == 2, result.output
    assert "--workers: must be at least 1, got 0" in result.output


def test_address_in_use_is_reported_at_once(tmp_path: Path) -> None:
    """A port something already listens on: exit 1 naming the address, before any
    worker or Redis starts."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(tmp_path, "g", port=port, engine_port=free_port())
        result = CliRunner().invoke(app, ["serve", "-c", str(config), "--workers", "2"])
    assert result.exit_code == 1, result.output
    assert f"127.0.0.1:{port} is already in use" in result.output
