"""The ``sluicegate`` command's offline subcommands."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluicegate.cli import app

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sluicegate.yaml"
runner = CliRunner()


def test_check_config_accepts_example() -> None:
    """check-config exits 0 on the reference config."""
    result = runner.invoke(app, ["check-config", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    assert "configuration is valid" in result.output


def test_check_config_rejects_bad_file(tmp_path: Path) -> None:
    """check-config exits 1 and names the bad field."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - name: m\n    max_concurrency: 0\n")
    result = runner.invoke(app, ["check-config", str(bad)])
    assert result.exit_code == 1
    assert "max_concurrency" in result.output


def test_plan_prints_operating_point_and_writes_png(tmp_path: Path) -> None:
    """plan prints the table and writes the PNG."""
    result = runner.invoke(
        app,
        ["plan", "--rate", "20", "--service-s", "4", "--slots", "32", "--slo-s", "2",
         "--out", str(tmp_path)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "replicas" in result.output
    png = tmp_path / "p99-wait-vs-utilization.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_infeasible_is_a_clear_error(tmp_path: Path) -> None:
    """An SLO no replica count can meet exits 1 with a message."""
    result = runner.invoke(
        app,
        ["plan", "--rate", "1000", "--service-s", "10", "--slots", "1", "--slo-s", "0.001",
         "--max-replicas", "2", "--out", str(tmp_path)],
    )  # fmt: skip
    assert result.exit_code == 1


UNKNOWN_STORE = "models: [{name: m}]\nstore: sqlite:///state.db\n"
ORACLE_POLICY = "models:\n  - name: m\n    lanes:\n      - {name: interactive, policy: %s}\n"
REFUSED = [
    pytest.param(UNKNOWN_STORE, ("store (line 2)", "Redis or Valkey"), id="unknown-store"),
    pytest.param(
        ORACLE_POLICY % "oracle",
        ("models[0].lanes[0].policy (line 4)", "'oracle' is simulation-only"),
        id="oracle",
    ),
    pytest.param(
        ORACLE_POLICY % "slack-oracle",
        ("models[0].lanes[0].policy (line 4)", "'slack-oracle' is simulation-only"),
        id="slack-oracle",
    ),
]


def _flat(text: str) -> str:
    """``text`` with rich's line wrapping undone."""
    return " ".join(text.split())


@pytest.mark.parametrize(("text", "expected"), REFUSED)
def test_check_config_refuses_what_the_gateway_cannot_do(
    tmp_path: Path, text: str, expected: tuple[str, ...]
) -> None:
    """check-config exits 1, naming the field and saying why."""
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["check-config", str(path)])
    assert result.exit_code == 1, result.output
    assert all(part in _flat(result.output) for part in expected), result.output
    assert "configuration is valid" not in result.output


@pytest.mark.parametrize(("text", "expected"), REFUSED)
def test_serve_refuses_what_the_gateway_cannot_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: tuple[str, ...]
) -> None:
    """serve exits 1 with the message before starting anything."""
    import sluicegate.gateway.app

    started: list[object] = []
    monkeypatch.setattr(sluicegate.gateway.app, "serve", lambda *a, **k: started.append(a))
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["serve", "--config", str(path)])
    assert result.exit_code == 1, result.output
    assert all(part in _flat(result.output) for part in expected), result.output
    assert started == []


def test_serve_refuses_a_batches_path_whose_directory_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serve exits 1 naming ``batches.path`` and the missing directory, before starting."""
    import sluicegate.gateway.app

    started: list[object] = []
    monkeypatch.setattr(sluicegate.gateway.app, "serve", lambda *a, **k: started.append(a))
    missing = tmp_path / "no-such-dir"
    path = tmp_path / "gateway.yaml"
    path.write_text(
        "models:\n  - name: m\n    backends: [{name: b, url: 'http://127.0.0.1:9'}]\n"
        f"batches: {{path: '{missing / 'b.db'}'}}\n"
    )
    result = runner.invoke(app, ["serve", "--config", str(path)])
    assert result.exit_code == 1, result.output
    assert f"batches.path: directory {missing} does not exist" in _flat(result.output)
    assert started == []


def test_simulate_accepts_the_oracles(tmp_path: Path) -> None:
    """simulate runs a config whose lane names ``oracle``, and ``--policy oracle``."""
    path = tmp_path / "sim.yaml"
    path.write_text(ORACLE_POLICY % "slack-oracle" + "simulation: {preset: tiny, replicas: 1}\n")
    result = runner.invoke(
        app,
        ["simulate", "--config", str(path), "--poisson", "2", "--duration", "5",
         "--policy", "oracle", "--policy", "slack-oracle", "--out", str(tmp_path / "out"),
         "--workers", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "results.json").is_file()


def test_bench_refuses_a_prefix_mapping(tmp_path: Path) -> None:
    """``bench --field prefix=...`` would change nothing (bench sends synthetic text), so it
    is refused with a message saying why, before any load is sent."""
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"ts": 0, "in": 10, "out": 5, "h": [1, 2]}\n', encoding="utf-8")
    result = CliRunner().invoke(
        app,
        [
            "bench", "--url", "http://127.0.0.1:9", "--model", "m", "--trace", str(trace),
            "--field", "arrival=ts:ms", "--field", "prompt=in", "--field", "output=out",
            "--field", "prefix=h",
        ],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "bench sends synthetic prompt text" in result.output
