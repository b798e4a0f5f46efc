"""``core/`` and ``engine/`` are sans-I/O (DESIGN §2), and the core's imports form no cycle.

The checks read the source (the AST of every module), so they hold for the
mypyc build too; each is shown able to fail on a violation planted in a copy.
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "sluicegate"

IO_MODULES = frozenset(
    {
        "aiohttp",
        "asyncio",
        "concurrent",
        "httpx",
        "multiprocessing",
        "redis",
        "selectors",
        "socket",
        "ssl",
        "starlette",
        "subprocess",
        "threading",
        "time",
        "uvicorn",
    }
)
IO_BUILTINS = frozenset({"__import__", "input", "open", "print"})
CLOCK_READS = frozenset({"now", "utcnow", "today"})
SANS_IO_PACKAGES = ("core", "engine")
SHARED_ROOT = "sluicegate.errors"
"""The one module of sluicegate outside them they may import: it imports nothing itself
(``tests/test_error_root.py``)."""


def _imported(node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
        yield node.module


def _called(node: ast.Call) -> str | None:
    """``f`` for ``f(…)``, ``a.b`` for ``a.b(…)``, ``a.b.c`` for ``a.b.c(…)``; else ``None``."""
    parts = []
    func: ast.expr = node.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    parts.append(func.id)
    return ".".join(reversed(parts))


def io_violations(package: Path) -> list[str]:
    """Every I/O or clock use in the modules under ``package`` (a ``sluicegate/X`` folder).

    Flags imports of I/O, concurrency and clock modules; imports of other sluicegate
    packages (but ``SHARED_ROOT``); calls of ``time.*``, of
    ``…datetime.now``/``utcnow``/``today``, of ``importlib.*`` and of the I/O builtins.
    """
    own = f"sluicegate.{package.name}"
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package.parent)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for module in _imported(node):
                top = module.split(".")[0]
                if top in IO_MODULES or top == "importlib":
                    found.append(f"{where}:{node.lineno}: imports {module}")
                elif (
                    top == "sluicegate"
                    and module != SHARED_ROOT
                    and not (module == own or module.startswith(own + "."))
                ):
                    found.append(f"{where}:{node.lineno}: imports {module} from outside {own}")
            if isinstance(node, ast.Call) and (called := _called(node)) is not None:
                parts = called.split(".")
                if (
                    parts[0] in ("time", "importlib")
                    or called in IO_BUILTINS
                    or (len(parts) > 1 and parts[-1] in CLOCK_READS and "date" in parts[-2])
                ):
                    found.append(f"{where}:{node.lineno}: calls {called}")
    return found


@pytest.mark.parametrize("package", SANS_IO_PACKAGES)
def test_sans_io_packages_do_no_io_and_read_no_clock(package: str) -> None:
    """``core/`` and ``engine/`` import no I/O, concurrency or clock module and nothing of
    sluicegate outside themselves but the error root (``SHARED_ROOT``), and call no clock,
    dynamic import or I/O builtin (DESIGN §2)."""
    assert (SRC / package / "__init__.py").exists()
    assert io_violations(SRC / package) == []


PLANTS: list[tuple[str, str]] = [
    ("import asyncio\n", "imports asyncio"),
    ("import socket as s\n", "imports socket"),
    ("from time import monotonic\n", "imports time"),
    ("from aiohttp import web\n", "imports aiohttp"),
    ("from starlette.responses import Response\n", "imports starlette.responses"),
    ("import uvicorn\n", "imports uvicorn"),
    ("import redis.asyncio\n", "imports redis.asyncio"),
    ("import threading\n", "imports threading"),
    ("def f():\n    return time.monotonic()\n", "calls time.monotonic"),
    ("def f():\n    return datetime.datetime.now()\n", "calls datetime.datetime.now"),
    ("def f():\n    return __import__('socket')\n", "calls __import__"),
    ("def f():\n    return importlib.import_module('socket')\n", "calls importlib.import_module"),
    ("def f(p):\n    return open(p).read()\n", "calls open"),
    ("from sluicegate.gateway import app\n", "imports sluicegate.gateway from outside"),
    ("from sluicegate.errors_more import E\n", "imports sluicegate.errors_more from outside"),
    ("from sluicegate import errors\n", "imports sluicegate from outside"),
]


@pytest.mark.parametrize("package", SANS_IO_PACKAGES)
@pytest.mark.parametrize(("plant", "reported"), PLANTS)
def test_sans_io_check_catches_a_planted_violation(
    package: str, plant: str, reported: str, tmp_path: Path
) -> None:
    """The check above can fail: in a copy of the package with one violation appended to
    one module, it reports exactly that violation (the tree itself is never touched)."""
    copy = tmp_path / package
    shutil.copytree(SRC / package, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    module = sorted(copy.rglob("*.py"))[-1]
    module.write_text(module.read_text(encoding="utf-8") + "\n" + plant, encoding="utf-8")
    found = io_violations(copy)
    assert len(found) == 1, found
    assert found[0].startswith(f"{package}/{module.relative_to(copy)}:")
    assert reported in found[0]


def _module_name(path: Path, package: Path) -> str:
    """The import name of ``path``, a module of ``sluicegate.<package.name>`` (wherever the
    package folder lies)."""
    parts = path.with_suffix("").relative_to(package).parts
    return ".".join(("sluicegate", package.name, *parts)).removesuffix(".__init__")


def import_problems(package: Path) -> list[str]:
    """Imports inside functions or classes, and cycles among the package's modules.

    A deferred import is how a cycle hides; with every import at module level,
    a cycle shows in the graph.
    """
    found = []
    graph: dict[str, set[str]] = {}
    prefix = f"sluicegate.{package.name}"
    for path in sorted(package.rglob("*.py")):
        name = _module_name(path, package)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        top_level = {id(node) for node in tree.body}
        graph[name] = set()
        for node in ast.walk(tree):
            modules = list(_imported(node))
            if modules and id(node) not in top_level:
                found.append(f"{name}:{node.lineno}: deferred import of {modules[0]}")
            graph[name] |= {m for m in modules if m == prefix or m.startswith(prefix + ".")}
    visiting: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> None:
        if module in visiting:
            found.append("cycle: " + " -> ".join([*visiting[visiting.index(module) :], module]))
            return
        if module in done:
            return
        visiting.append(module)
        for dependency in sorted(graph.get(module, ())):
            visit(dependency)
        visiting.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
    return found


def test_core_imports_are_at_module_level_and_form_no_cycle() -> None:
    """No core module defers an import into a function (the old way to dodge a cycle), and
    the core's modules import each other without a cycle."""
    assert import_problems(SRC / "core") == []


@pytest.mark.parametrize(
    ("plant", "reported"),
    [
        ("def f():\n    import heapq\n", "deferred import of heapq"),
        ("from sluicegate.core.scheduler import Scheduler\n", "cycle: "),
    ],
)
def test_import_check_catches_a_planted_problem(plant: str, reported: str, tmp_path: Path) -> None:
    """The check above can fail: a deferred import, or an import that closes a cycle
    (``spec`` importing ``scheduler``, which imports ``spec`` through ``runtime``), planted
    in a copy of the core is reported, and nothing else is."""
    copy = tmp_path / "core"
    shutil.copytree(SRC / "core", copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    spec = copy / "spec.py"
    spec.write_text(spec.read_text(encoding="utf-8") + "\n" + plant, encoding="utf-8")
    found = import_problems(copy)
    assert found
    assert all(reported in problem for problem in found), found


@pytest.mark.parametrize("package", SANS_IO_PACKAGES)
def test_sans_io_check_lets_the_error_root_in(package: str, tmp_path: Path) -> None:
    """The one exemption is exactly ``from sluicegate.errors import …``: planted in a copy
    of the package, it is not reported (the plants above show its neighbours are)."""
    copy = tmp_path / package
    shutil.copytree(SRC / package, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    module = sorted(copy.rglob("*.py"))[-1]
    plant = "from sluicegate.errors import SluicegateError\n"
    module.write_text(module.read_text(encoding="utf-8") + "\n" + plant, encoding="utf-8")
    assert io_violations(copy) == []
