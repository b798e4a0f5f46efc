"""The ``sluicegate`` command's offline subcommands."""

from __future__ import annotations

from pathlib import Path

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
