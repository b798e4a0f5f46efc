"""The README and the reference config document everything there is: every config field
and every command."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from pathlib import Path

import typer
from pydantic import BaseModel
from typer.core import TyperGroup

from sluicegate.cli import app
from sluicegate.config import Config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
EXAMPLE = (ROOT / "examples" / "sluicegate.yaml").read_text(encoding="utf-8")


def _section(title: str) -> str:
    """The README's ``## title`` section, up to the next ``## `` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def _models_in(annotation: object) -> Iterator[type[BaseModel]]:
    """The pydantic models an annotation holds, through unions, tuples and ``| None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in typing.get_args(annotation):
        yield from _models_in(argument)


def _fields(model: type[BaseModel], path: str) -> Iterator[tuple[str, str]]:
    """(dotted path, field name) of every field of ``model`` and of the models inside it."""
    for name, field in model.model_fields.items():
        yield f"{path}{name}", name
        for inner in _models_in(field.annotation):
            yield from _fields(inner, f"{path}{name}.")


def test_the_walk_reaches_nested_models() -> None:
    """The walk goes into lanes, backends, adaptive, preemptible and tenants."""
    paths = {path for path, _ in _fields(Config, "")}
    assert {
        "server.max_headers", "models.lanes.preemptible.after_fraction",
        "models.backends.engine", "models.adaptive.long_window", "tenants.api_key_env",
        "simulation.replicas", "models.preempt_slack_s",
    } <= paths  # fmt: skip


def test_every_config_field_is_documented() -> None:
    """Each field is in a code span of the README's configuration reference, or a key
    (perhaps in a comment) of examples/sluicegate.yaml."""
    reference = " ".join(re.findall(r"`([^`]*)`", _section("Configuration")))
    missing = sorted(
        path
        for path, name in _fields(Config, "")
        if not re.search(rf"(?<![\w-]){name}(?![\w-])", reference)
        and not re.search(rf"(?<![\w-]){name}:", EXAMPLE)
    )
    assert not missing, f"config fields documented nowhere: {missing}"


def test_command_table_lists_every_command() -> None:
    """Every command ``sluicegate --help`` shows has a row in the README's command table."""
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    shown = {name for name, command in group.commands.items() if not command.hidden}
    rows = re.findall(r"^\| `sluicegate ([\w-]+)", _section("Commands"), re.M)
    missing = sorted(shown - set(rows))
    assert not missing, f"commands missing from the README table: {missing}"
    assert set(rows) <= shown, f"README lists commands that do not exist: {set(rows) - shown}"
