"""One error root (``sluicegate.errors.SluicegateError``) and one boundary where errors
become HTTP answers (the app's exception handlers, ``gateway/app.py``).

Every exception class defined under ``src/sluicegate`` derives from the root, found by
importing every module; the gateway answers a ``GatewayError`` raised in a Starlette
endpoint through the app-level handler, with the same bytes the inference path sends.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from starlette.applications import Starlette

import sluicegate
from sluicegate.errors import SluicegateError
from sluicegate.gateway.app import build_app
from sluicegate.gateway.http_errors import GatewayError
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    Stack,
    gateway_config,
    http_call,
    openai_error,
    serve_in_thread,
    stack,
)

SRC = Path(sluicegate.__file__).parent

SECOND_BASES: dict[str, type[BaseException]] = {
    "sluicegate.config.ConfigError": ValueError,
    "sluicegate.core.core_errors.UnknownModelError": KeyError,
    "sluicegate.gateway.workers.private_redis.PrivateRedisError": RuntimeError,
    "sluicegate.gateway.workers.supervisor.WorkersError": RuntimeError,
    "sluicegate.planner.queueing.PlanInfeasibleError": ValueError,
    "sluicegate.sim.workloads.mix.MixError": ValueError,
    "sluicegate.sim.workloads.workload_errors.WorkloadError": ValueError,
}
"""The built-in type each of these is also caught as, kept beside the root."""


def _modules(package: ModuleType) -> Iterator[ModuleType]:
    """``package`` and every module under it (not ``__main__``, which runs the CLI)."""
    yield package
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if info.name.rpartition(".")[2] != "__main__":
            yield importlib.import_module(info.name)


def defined_classes(package: ModuleType) -> dict[str, type]:
    """Every class defined (not just imported) in a module of ``package``, by qualified
    name."""
    return {
        f"{module.__name__}.{name}": value
        for module in _modules(package)
        for name, value in vars(module).items()
        if inspect.isclass(value) and value.__module__ == module.__name__
    }


def exception_classes(package: ModuleType) -> dict[str, type[BaseException]]:
    """Every exception class defined in a module of ``package``, by qualified name."""
    return {
        name: cls
        for name, cls in defined_classes(package).items()
        if issubclass(cls, BaseException)
    }


def outside_the_root(package: ModuleType) -> set[str]:
    """The exception classes of ``package`` that do not derive from ``SluicegateError``."""
    return {
        name
        for name, cls in exception_classes(package).items()
        if not issubclass(cls, SluicegateError)
    }


def test_every_exception_class_derives_from_the_root() -> None:
    """Every exception class of sluicegate is a ``SluicegateError``."""
    assert outside_the_root(sluicegate) == set()


def test_the_walk_sees_every_exception_class_in_the_source() -> None:
    """The walk is complete: each ``class …Error``/``…Exception`` written anywhere under
    ``src/sluicegate`` (nested ones included) is a class it inspected (``LineError`` is
    one that is no exception), and it finds private helpers and the core's."""
    seen = {name.rpartition(".")[2] for name in defined_classes(sluicegate)}
    found = {name.rpartition(".")[2] for name in exception_classes(sluicegate)}
    written = {
        node.name
        for path in SRC.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef) and node.name.endswith(("Error", "Exception"))
    }
    assert written - seen == set()
    assert "LineError" in written - found
    assert {"GatewayError", "UnknownModelError", "_IncompleteError", "_NoMetricsError"} <= found


def test_the_check_catches_a_class_outside_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check can fail: in a planted package, the class on ``Exception`` is reported,
    the one on the root and an imported one are not."""
    package = tmp_path / "planted_errors"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "inner.py").write_text(
        "from sluicegate.errors import SluicegateError\n"
        "from sluicegate.config import ConfigError\n\n"
        "class Rooted(SluicegateError):\n    pass\n\n"
        "class Stray(Exception):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        planted = importlib.import_module("planted_errors")
        assert outside_the_root(planted) == {"planted_errors.inner.Stray"}
    finally:
        for name in ("planted_errors", "planted_errors.inner"):
            sys.modules.pop(name, None)


def test_second_bases_are_kept() -> None:
    """A class callers also catch as a built-in type is still one (``except ValueError``
    around config parsing, ``except KeyError`` around a model lookup, …)."""
    classes = exception_classes(sluicegate)
    for name, base in SECOND_BASES.items():
        assert issubclass(classes[name], SluicegateError), name
        assert issubclass(classes[name], base), name


def test_the_root_imports_nothing() -> None:
    """``sluicegate/errors.py`` imports nothing but ``__future__``, so any layer, the
    sans-I/O core included, may import it."""
    tree = ast.parse((SRC / "errors.py").read_text(encoding="utf-8"))
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]
    assert [getattr(node, "module", None) for node in imports] == ["__future__"]


@pytest.fixture(scope="module")
def gateway() -> Iterator[Stack]:
    """A gateway with one tenant key, so ``/v1/models`` and inference need a key."""
    tenants = "tenants:\n  - {name: a, api_key_env: KEY_A}\n"
    with stack(tenants, environ={"KEY_A": "sk-error-root-canary"}) as live:
        yield live


def test_a_gateway_error_in_an_ops_endpoint_is_answered_by_the_app(gateway: Stack) -> None:
    """``/admin/state`` without the key raises ``GatewayError(401)`` from its check and
    catches nothing: the client gets the OpenAI-shaped 401, ``no-store`` included."""
    reply = http_call(gateway.base_url, "GET", "/admin/state")
    assert reply.status == 401
    error = openai_error(reply)
    assert (error["type"], error["code"], error["param"]) == (
        "authentication_error",
        "invalid_admin_key",
        None,
    )
    assert error["message"] == "this endpoint needs the admin key"
    assert reply.headers["cache-control"] == "no-store"


def test_both_paths_answer_the_same_bytes(gateway: Stack) -> None:
    """The same refusal (no key) from a Starlette endpoint (``/v1/models``) and from the
    plain-ASGI inference path is the same answer: status, headers in order, and body."""
    ops = http_call(gateway.base_url, "GET", "/v1/models")
    inference = http_call(gateway.base_url, "POST", "/v1/chat/completions", json={})
    assert ops.status == inference.status == 401
    assert openai_error(ops)["code"] == "invalid_api_key"
    assert ops.body == inference.body
    without_date = [[(k, v) for k, v in r.headers.items() if k != "date"] for r in (ops, inference)]
    assert without_date[0] == without_date[1]


def test_without_the_app_handler_the_error_is_no_answer() -> None:
    """The handler is the one boundary: taken out of a gateway's app, the same request
    gets Starlette's plain-text 500 instead (no endpoint renders the error itself)."""
    config = gateway_config([9], "")
    app = build_app(config, environ={"SLUICEGATE_ADMIN_KEY": ADMIN_KEY}, scrape=False)
    fallback = app._fallback
    assert isinstance(fallback, Starlette)
    del fallback.exception_handlers[GatewayError]
    with serve_in_thread(app) as port:
        reply = http_call(f"http://127.0.0.1:{port}", "GET", "/admin/state")
    assert reply.status == 500
    assert not reply.headers["content-type"].startswith("application/json")
