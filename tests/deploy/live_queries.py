"""Every PromQL expression we ship, gathered for the live Prometheus test.

The rules of ``deploy/prometheus/rules.yml`` (via ``promql.rule_expressions``), the
Prometheus triggers of every KEDA ``ScaledObject`` in the rendered overlays
(``kubectl kustomize``), and the Grafana panel targets (``promql.grafana_expressions``);
the config's pressure queries come from the stack. ``operands`` splits an alert's
condition at its top-level comparisons and set operators, for alerts that are
rightly false under the test's load.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.promql import RULES, grafana_expressions, rule_expressions

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"


@dataclass(frozen=True)
class Shipped:
    """One shipped expression: where it comes from, a name for messages, the PromQL."""

    source: str
    name: str
    expr: str


def alert_rules(rules_path: Path = RULES) -> dict[str, dict[str, Any]]:
    """Alert name → its rule (``expr``, ``for``, ``labels``...)."""
    document = yaml.safe_load(rules_path.read_text())
    return {
        rule["alert"]: rule
        for group in document["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def rules_expressions() -> list[Shipped]:
    """Every recording and alert rule's expression."""
    alerts = alert_rules()
    return [
        Shipped("alert" if name in alerts else "record", name, expr)
        for name, expr in rule_expressions()
    ]


def rendered_overlays() -> dict[str, list[dict[str, Any]]]:
    """Overlay directory (relative to ``deploy/k8s``) → its ``kubectl kustomize`` objects,
    for every directory under ``deploy/k8s`` that holds a kustomization."""
    rendered = {}
    for kustomization in sorted(K8S.rglob("kustomization.yaml")):
        directory = kustomization.parent
        if directory.name == "base" or "components" in directory.parts:
            continue
        output = subprocess.run(
            ["kubectl", "kustomize", str(directory)],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        objects = [doc for doc in yaml.safe_load_all(output) if doc]
        rendered[str(directory.relative_to(K8S))] = objects
    return rendered


def keda_expressions(model: str) -> list[Shipped]:
    """Every Prometheus trigger query of every ``ScaledObject`` in the rendered overlays,
    the model the manifests name (``model="..."``) replaced by ``model``."""
    found = []
    for overlay, objects in rendered_overlays().items():
        for obj in objects:
            if obj.get("kind") != "ScaledObject":
                continue
            for index, trigger in enumerate(obj["spec"]["triggers"]):
                if trigger["type"] != "prometheus":
                    continue
                query = re.sub(r'model="[^"]*"', f'model="{model}"', trigger["metadata"]["query"])
                name = f"{overlay}:{obj['metadata']['name']}#{index}"
                found.append(Shipped("keda", name, query))
    return found


def shipped_config_pressure() -> list[Shipped]:
    """The pressure queries of the config the manifests ship (``deploy/k8s/base``)."""
    config = yaml.safe_load((K8S / "base" / "sluicegate.yaml").read_text())
    signals = config["pressure"]["signals"]
    return [Shipped("pressure", f"k8s base {s['name']}", s["query"]) for s in signals]


def grafana_shipped() -> list[Shipped]:
    """Every Grafana panel target (template variables substituted by ``promql``)."""
    return [Shipped("grafana", f"target {i}", e) for i, e in enumerate(grafana_expressions())]


_COMPARISON = ("==", "!=", ">=", "<=", ">", "<")
_SET_OPERATORS = ("and", "or", "unless")
_MODIFIER = re.compile(r"\s*(?:bool\b|(?:on|ignoring|group_left|group_right)\b\s*(?:\([^)]*\))?)")
_NUMBER = re.compile(r"^\s*[-+]?(?:\d+(?:\.\d*)?(?:e[-+]?\d+)?|\.\d+|inf|nan)\s*$", re.IGNORECASE)


def _split_top_level(expr: str) -> list[str]:
    """``expr`` cut at every comparison and set operator outside brackets and strings."""
    parts, depth, start, i = [], 0, 0, 0
    quote: str | None = None
    while i < len(expr):
        char = expr[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = None
        elif char in "\"'`":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0:
            operator = next((op for op in _COMPARISON if expr.startswith(op, i)), None)
            word = re.match(r"(and|or|unless)\b", expr[i:])
            if word and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] in "_:")):
                operator = word.group(1)
            if operator:
                parts.append(expr[start:i])
                i += len(operator)
                start = i
                continue
        i += 1
    parts.append(expr[start:])
    return parts


def _unwrap(expr: str) -> str | None:
    """``expr`` without the parentheses around all of it (None if it is not so wrapped)."""
    expr = expr.strip()
    if not (expr.startswith("(") and expr.endswith(")")):
        return None
    depth = 0
    for index, char in enumerate(expr):
        depth += (char == "(") - (char == ")")
        if depth == 0 and index < len(expr) - 1:
            return None  # "(a) + (b)": the first parenthesis closes early
    return expr[1:-1]


def operands(expr: str) -> list[str]:
    """The operands of ``expr``'s top-level comparisons and set operators: the expression
    split there (and inside a wholly parenthesised operand, again), each side's leading
    ``bool``/``on(...)``/``group_left(...)`` modifiers dropped, number literals left out.
    ``a > on(x) group_left b and (c > 0.5 or d)`` gives ``[a, b, c, d]``; an expression
    without such operators gives itself."""
    found = []
    parts = _split_top_level(expr)
    for part in parts:
        while (match := _MODIFIER.match(part)) and part.strip():
            part = part[match.end() :]
        inner = _unwrap(part)
        if inner is not None and len(parts) > 1:
            found += operands(inner)
        elif part.strip() and not _NUMBER.match(part):
            found.append(part.strip())
    return found
