"""``bench`` and ``sim`` share ``outcomes`` and never import each other (DESIGN §2)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def module_name(path: Path) -> str:
    """``src/sluicegate/sim/virtual_driver.py`` → ``sluicegate.sim.virtual_driver``."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str, module: str, *, is_package: bool = False) -> set[str]:
    """Every module name ``source`` (the text of ``module``) imports, anywhere in it.

    Imports inside functions and ``TYPE_CHECKING`` blocks count; relative imports are
    resolved; ``from a import b`` yields ``a`` and ``a.b`` (``b`` may be a module).
    """
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def package_imports(package: str) -> dict[str, set[str]]:
    """Module → what it imports, for every module of ``sluicegate.<package>``."""
    found = {}
    for path in sorted((SRC / "sluicegate" / package).rglob("*.py")):
        name = module_name(path)
        found[name] = imports(path.read_text(), name, is_package=path.name == "__init__.py")
    return found


def within(names: set[str], package: str) -> set[str]:
    """The names that are ``package`` or inside it."""
    return {n for n in names if n == package or n.startswith(package + ".")}


def offenders(package: str, forbidden: str) -> dict[str, set[str]]:
    """Modules of ``package`` that import anything of ``forbidden``, with what they import."""
    found = package_imports(package).items()
    return {module: hits for module, names in found if (hits := within(names, forbidden))}


@pytest.mark.parametrize(("package", "forbidden"), [("bench", "sim"), ("sim", "bench")])
def test_bench_and_sim_do_not_import_each_other(package: str, forbidden: str) -> None:
    """No module of one package imports the other, at module level or inside a function."""
    assert offenders(package, f"sluicegate.{forbidden}") == {}


def test_outcomes_imports_nothing_else_of_sluicegate() -> None:
    """``outcomes`` lies below both: it imports only itself of sluicegate."""
    found = {
        module: within(names, "sluicegate") - within(names, "sluicegate.outcomes")
        for module, names in package_imports("outcomes").items()
    }
    assert {module: names for module, names in found.items() if names} == {}


def test_both_build_on_outcomes() -> None:
    """The check sees real imports: each package does import ``outcomes``."""
    assert offenders("bench", "sluicegate.outcomes")
    assert offenders("sim", "sluicegate.outcomes")


@pytest.mark.parametrize(
    "source",
    [
        "import sluicegate.sim.virtual_driver",
        "from sluicegate import sim",
        "from sluicegate.sim.run_summary import summarize",
        "def late():\n    from sluicegate.sim import run\n",
        "from ..sim import metrics",
        "from ...sluicegate.sim import metrics",
    ],
)
def test_every_form_of_import_is_seen(source: str) -> None:
    """Absolute, from-package, function-level and relative imports all count."""
    assert within(imports(source, "sluicegate.bench.analysis"), "sluicegate.sim")


def test_a_relative_import_inside_the_package_stays_inside() -> None:
    """``from .records import X`` in ``bench/analysis.py`` is ``sluicegate.bench.records``."""
    names = imports("from .records import RequestRecord", "sluicegate.bench.analysis")
    assert "sluicegate.bench.records" in names
    assert not within(names, "sluicegate.sim")
