"""The house rules of the source tree (CONTRIBUTING "Where things live", DESIGN §2).

Each rule is checked on the real tree and shown able to fail on a planted violation.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "sluicegate"
DESIGN = REPO / "docs" / "DESIGN.md"
MAX_LINES = 400
NAME = re.compile(r"[\w.]+(\.py|/)")

# Top-level packages and modules of sluicegate, bottom first: each may import only
# what stands on a lower level (or itself). ``errors`` imports nothing.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors"}),
    frozenset({"core", "engine", "engine_profiles", "outcomes"}),
    frozenset({"store", "emulator", "calibrate"}),
    frozenset({"batches"}),
    frozenset({"config_pressure"}),
    frozenset({"config"}),
    frozenset({"gateway", "sim"}),
    frozenset({"bench", "clients", "planner"}),
    frozenset({"demo"}),
    frozenset({"cli"}),
    frozenset({"__main__"}),
)

# The gateway's sub-packages, bottom first: each may import the gateway's root modules
# and the sub-packages on lower levels, never one above (``state.py`` and ``app.py``, the
# root that wires them, may import any).
GATEWAY_LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"streams", "upstream", "distributed"}),
    frozenset({"request"}),
    frozenset({"batch_lane"}),
    frozenset({"ops"}),
    frozenset({"workers"}),
)


def modules(root: Path) -> list[Path]:
    """Every ``.py`` file below ``root``, ``__init__.py`` included."""
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def duplicate_names(files: list[Path]) -> list[str]:
    """Module names (``__init__`` aside) that stand in more than one package."""
    counts = Counter(p.name for p in files if p.name != "__init__.py")
    return sorted(name for name, n in counts.items() if n > 1)


def long_modules(files: list[Path], limit: int = MAX_LINES) -> list[str]:
    """The files over ``limit`` lines, with their length."""
    lengths = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in files}
    return sorted(f"{p.name}: {n}" for p, n in lengths.items() if n > limit)


def packages_without_docstring(root: Path) -> list[str]:
    """Folders holding Python modules whose ``__init__.py`` is missing or has no docstring."""
    missing = []
    for folder in sorted({p.parent for p in modules(root)}):
        init = folder / "__init__.py"
        if not init.exists() or ast.get_docstring(ast.parse(init.read_text("utf-8"))) is None:
            missing.append(str(folder.relative_to(root.parent)))
    return missing


def top_level(name: str) -> str | None:
    """``sluicegate.gateway.app`` → ``gateway``; None for a module outside sluicegate."""
    parts = name.split(".")
    if parts[0] != "sluicegate" or len(parts) < 2:
        return None
    return parts[1]


def imported_modules(path: Path) -> list[str]:
    """Every absolute module name ``path`` imports, anywhere in it (functions and
    ``TYPE_CHECKING`` blocks included); ``from sluicegate import x`` imports ``sluicegate.x``."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "sluicegate":
                names.extend(f"sluicegate.{alias.name}" for alias in node.names)
            else:
                names.append(node.module)
    return names


def layer_violations(
    root: Path,
    layers: tuple[frozenset[str], ...],
    own_part: Callable[[tuple[str, ...]], str | None],
    target_part: Callable[[str], str | None],
) -> list[str]:
    """Imports from a part of ``root`` to a part on a higher level of ``layers``.

    ``own_part`` names the part a file belongs to (from its path below ``root``; None:
    not checked), ``target_part`` the part an imported module belongs to (None: not a
    part). A part missing from ``layers`` is reported too.
    """
    level = {name: i for i, names in enumerate(layers) for name in names}
    found = []
    for path in modules(root):
        relative = path.relative_to(root)
        own = own_part(relative.parts)
        if own is None:
            continue
        for target in imported_modules(path):
            other = target_part(target)
            if other is None or other == own:
                continue
            if other not in level or own not in level:
                found.append(f"{relative}: {target} (not in the layers)")
            elif level[other] > level[own]:
                found.append(f"{relative} imports {target}")
    return found


def upward_imports(root: Path) -> list[str]:
    """Imports from a top-level part of sluicegate to one on a higher level (``LAYERS``)."""
    return layer_violations(root, LAYERS, lambda parts: parts[0].removesuffix(".py"), top_level)


def design_tree_modules(text: str) -> set[str]:
    """The module paths DESIGN §2's tree names, relative to ``src/sluicegate``.

    The tree is the first fenced block of §2 whose first line is ``src/sluicegate/``.
    A line is ``<indent><names>  <description>``: two spaces of indent per level,
    names separated by ``, `` (``a.py``, ``b.py``, or a folder ``pkg/``), then two or
    more spaces. A folder opens a level; a ``pkg/`` line stands for its ``__init__.py``.
    """
    section = text.split("\n## 2.", 1)[1].split("\n## 3.", 1)[0]
    block = re.search(r"```\nsrc/sluicegate/\n(.*?)```", section, re.S)
    assert block is not None, "DESIGN §2 has no tree starting with src/sluicegate/"
    found: set[str] = set()
    stack: list[str] = []
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        names_part = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        if not all(NAME.fullmatch(n.strip()) for n in names_part.split(",")):
            continue  # a continuation line of a description
        depth = indent // 2 - 1
        del stack[depth:]
        for name in (n.strip() for n in names_part.split(",")):
            prefix = "".join(stack)
            if name.endswith("/"):
                found.add(f"{prefix}{name}__init__.py")
                opened = name
            else:
                found.add(f"{prefix}{name}")
        if names_part.endswith("/"):
            stack.append(opened)
    return found


def tree_differences(root: Path, text: str) -> tuple[list[str], list[str]]:
    """(modules missing from the tree, listed modules that do not exist)."""
    listed = design_tree_modules(text)
    real = {str(p.relative_to(root)) for p in modules(root)}
    return sorted(real - listed), sorted(listed - real)


def test_design_tree_lists_every_module_and_only_those() -> None:
    """DESIGN §2's tree names every module of src/sluicegate, and nothing that is gone."""
    missing, stale = tree_differences(PACKAGE, DESIGN.read_text("utf-8"))
    assert not missing, f"modules missing from DESIGN §2: {missing}"
    assert not stale, f"DESIGN §2 lists modules that do not exist: {stale}"


def test_design_tree_check_catches_a_missing_and_a_stale_module(tmp_path: Path) -> None:
    """The tree check can fail: a new module, and a listed one that is gone, are both named."""
    root = tmp_path / "sluicegate"
    (root / "gateway").mkdir(parents=True)
    for name in ("__init__.py", "cli.py", "gateway/__init__.py", "gateway/app.py"):
        (root / name).write_text('"""x."""\n')
    text = (
        "\n## 2. Tree\n\n```\nsrc/sluicegate/\n  cli.py, __init__.py  the command\n"
        "  gateway/             the gateway\n    old.py  gone\n```\n\n## 3. Next\n"
    )
    missing, stale = tree_differences(root, text)
    assert missing == ["gateway/app.py"]
    assert stale == ["gateway/old.py"]


def test_gateway_and_package_roots_stay_small() -> None:
    """``gateway/`` holds at most 8 modules of its own, the package root at most 6."""
    gateway = sorted(p.name for p in (PACKAGE / "gateway").glob("*.py"))
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(gateway) <= 8, gateway
    assert len(root) <= 6, root


def test_module_names_are_unique() -> None:
    """No two modules share a name: each name says which module it is."""
    assert duplicate_names(modules(PACKAGE)) == []


def test_unique_names_check_catches_a_repeat(tmp_path: Path) -> None:
    """The name check can fail on a planted repeat."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "errors.py").write_text("")
    assert duplicate_names(modules(tmp_path)) == ["errors.py"]


@pytest.mark.parametrize("folder", ["src", "benchmarks"])
def test_no_module_over_400_lines(folder: str) -> None:
    """Small modules: none in ``src/`` or ``benchmarks/`` is over 400 lines."""
    assert long_modules(modules(REPO / folder)) == []


def test_every_package_says_what_it_owns() -> None:
    """Each folder of modules is a package whose ``__init__.py`` has a docstring."""
    assert packages_without_docstring(PACKAGE) == []


def test_no_import_runs_up_the_layers() -> None:
    """Every top-level part imports only its own or lower layers (``LAYERS``)."""
    assert upward_imports(PACKAGE) == []


def test_layer_check_catches_an_upward_import(tmp_path: Path) -> None:
    """The layer check can fail: ``store`` importing ``config`` is reported."""
    root = tmp_path / "sluicegate"
    (root / "store").mkdir(parents=True)
    (root / "store" / "check.py").write_text(
        "def f():\n    from sluicegate.config import Config\n    return Config\n"
    )
    assert upward_imports(root) == ["store/check.py imports sluicegate.config"]


def gateway_upward_imports(gateway: Path) -> list[str]:
    """Imports from a gateway sub-package to a sibling on a higher level (``GATEWAY_LAYERS``)."""

    def sub_package(target: str) -> str | None:
        parts = target.split(".")
        return parts[2] if parts[:2] == ["sluicegate", "gateway"] and len(parts) > 3 else None

    return layer_violations(
        gateway, GATEWAY_LAYERS, lambda parts: parts[0] if len(parts) > 1 else None, sub_package
    )


def test_gateway_sub_packages_import_downwards() -> None:
    """``request`` never imports ``ops`` or the batch lane; ``streams`` imports no sibling."""
    assert gateway_upward_imports(PACKAGE / "gateway") == []


def test_gateway_layer_check_catches_an_upward_import(tmp_path: Path) -> None:
    """The gateway check can fail: ``request`` importing ``ops`` is reported."""
    (tmp_path / "request").mkdir()
    (tmp_path / "request" / "exchange.py").write_text(
        "from sluicegate.gateway.ops.admin import guard\n"
    )
    assert gateway_upward_imports(tmp_path) == [
        "request/exchange.py imports sluicegate.gateway.ops.admin"
    ]
