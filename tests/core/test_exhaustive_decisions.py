"""Decisions are a closed union, so a dispatch that leaves a kind out fails ``mypy --strict``.

Both drivers (the simulator's ``sim/execute.py``, ``gateway/asyncio_driver.py``) dispatch
with ``match`` on the decision ending in ``case _: assert_never(decision)`` (DESIGN §3). Here the
same shape is planted in a scratch module, once with every kind and once without
each kind in turn, and the project's mypy is run on it against this tree's ``src``.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from sluicegate.core import decisions
from sluicegate.core.decisions import Decision

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
KINDS = sorted(kind.__name__ for kind in get_args(Decision))


def _dispatch_module(kinds: list[str]) -> str:
    cases = "".join(f"        case {kind}():\n            return {kind!r}\n" for kind in kinds)
    return (
        "from typing import assert_never\n\n"
        f"from sluicegate.core.decisions import Decision, {', '.join(KINDS)}\n\n\n"
        "def dispatch(decision: Decision) -> str:\n"
        "    match decision:\n"
        f"{cases}"
        "        case _:\n"
        "            assert_never(decision)\n"
    )


def test_every_decision_class_is_in_the_union() -> None:
    """A new decision class outside ``Decision`` would escape the drivers' exhaustiveness."""
    defined = {
        name
        for name, value in vars(decisions).items()
        if isinstance(value, type) and issubclass(value, tuple) and "ticket" in value._fields
    }
    assert defined == set(KINDS)
    assert len(KINDS) == 6


def test_mypy_strict_fails_a_dispatch_that_leaves_a_kind_out(tmp_path: Path) -> None:
    files = {"all_kinds.py": _dispatch_module(KINDS)}
    for left_out in KINDS:
        files[f"without_{left_out.lower()}.py"] = _dispatch_module(
            [kind for kind in KINDS if kind != left_out]
        )
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    # The project's mypy settings (strict, the pydantic plugin), this tree's ``src`` found
    # through MYPYPATH alone, so that errors anywhere would be reported.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", f"--config-file={ROOT / 'pyproject.toml'}",
         "--no-error-summary", "--cache-dir", str(tmp_path / ".mypy_cache"), *files],
        cwd=tmp_path, env={**env, "MYPYPATH": str(ROOT / "src")},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    errors: dict[str, list[str]] = {}
    for line in run.stdout.splitlines():
        found = re.match(r"([\w.]+\.py):\d+: error: (.*)", line)
        assert found is not None, run.stdout + run.stderr
        errors.setdefault(found.group(1), []).append(found.group(2))
    assert "all_kinds.py" not in errors, run.stdout
    for left_out in KINDS:
        expected = (
            f'Argument 1 to "assert_never" has incompatible type "{left_out}"; '
            'expected "Never"  [arg-type]'
        )
        assert errors.pop(f"without_{left_out.lower()}.py") == [expected], run.stdout
    assert errors == {}
    assert run.returncode == 1, run.stderr


def _dispatches(path: Path) -> list[ast.Match]:
    tree = ast.parse(path.read_text())
    return [node for node in ast.walk(tree) if isinstance(node, ast.Match)]


@pytest.mark.parametrize("driver", ["sim/execute.py", "gateway/asyncio_driver.py"])
def test_both_drivers_dispatch_every_kind_then_assert_never(driver: str) -> None:
    """What makes mypy check the drivers: one case per kind, then ``assert_never``."""
    (match,) = _dispatches(SRC / "sluicegate" / driver)
    assert isinstance(match.subject, ast.Name)
    *cases, last = match.cases
    handled = []
    for case in cases:
        patterns = (
            case.pattern.patterns if isinstance(case.pattern, ast.MatchOr) else [case.pattern]
        )
        for pattern in patterns:
            assert isinstance(pattern, ast.MatchClass), ast.unparse(pattern)
            assert isinstance(pattern.cls, ast.Name)
            handled.append(pattern.cls.id)
    assert sorted(handled) == KINDS
    assert isinstance(last.pattern, ast.MatchAs)
    assert last.pattern.pattern is None
    assert ast.unparse(last.body[0]) == f"assert_never({match.subject.id})"
