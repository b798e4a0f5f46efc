"""PromQL helpers shared by the deploy tests: which metrics an expression selects, and which
series sluicegate can export.

API:

- :func:`metric_names` — the metric names a PromQL expression selects (a small tokenizer,
  not a parser: it knows enough of the grammar to tell metric names from functions,
  keywords, label names, durations and strings).
- :func:`exported_series` — every sample name the gateway (with distributed mode, the
  pressure loop and ``--workers``) and the emulator can export, read from the real
  collectors.
- :data:`EXTERNAL_SERIES` — names we query that neither exports (Prometheus's ``up``,
  Kueue's pending workloads).
- :func:`recorded_names`, :func:`rule_expressions` — a Prometheus rules file's recording
  rule names, and every rule's expression.
- :func:`grafana_expressions` — every panel query of a Grafana dashboard, its template
  variables substituted so that the result is plain PromQL.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "rules.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "sluicegate-dashboard.json"

EXTERNAL_SERIES = frozenset({"up", "kueue_pending_workloads"})
"""Names our queries select that come from elsewhere: Prometheus's own per-target ``up`` and
Kueue's ``kueue_pending_workloads`` (read by the pressure loop)."""

_LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_KEYWORDS = _LABEL_LIST_KEYWORDS | {
    # aggregators
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
    # binary operators and modifiers, and the float literals Inf and NaN
    "and", "or", "unless", "bool", "offset", "inf", "nan",
}  # fmt: skip

_TOKEN = re.compile(
    r"""
    (?P<space>\s+|\#[^\n]*)
    | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    | (?P<number>\.?[0-9][0-9a-zA-Z_.]*)
    | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
    | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=(){}\[\],@])
    """,
    re.VERBOSE,
)


def _tokens(expr: str) -> list[tuple[str, str]]:
    """``(kind, text)`` of every token but whitespace and comments."""
    found: list[tuple[str, str]] = []
    position = 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        if match is None:
            raise ValueError(f"cannot tokenize PromQL at {expr[position : position + 20]!r}")
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            found.append((kind, match.group()))
        position = match.end()
    return found


def _unquote(literal: str) -> str:
    """The value of a PromQL string literal (raw in backticks, else with escapes)."""
    if literal.startswith("`"):
        return literal[1:-1]
    return str(ast.literal_eval(literal))


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects.

    A name is an identifier that is not followed by ``(`` (a function or aggregator call),
    not a keyword (``and``, ``by``, ``offset``, aggregators, ``Inf``...), and not inside a
    label list (``by (...)``, ``without``, ``on``, ``ignoring``, ``group_left``,
    ``group_right``), braces, brackets or a string; plus the value of every
    ``__name__="..."`` matcher. Regex matchers on ``__name__`` name no single metric and are
    not counted.
    """
    tokens = _tokens(expr)
    names: set[str] = set()
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "ident" and text.lower() in _LABEL_LIST_KEYWORDS and following == "(":
            i = _closing(tokens, i + 1, "(", ")")
        elif kind == "ident" and text.lower() not in _KEYWORDS and following != "(":
            names.add(text)
        elif text == "{":
            end = _closing(tokens, i, "{", "}")
            names |= _name_matchers(tokens[i + 1 : end])
            i = end
        elif text == "[":
            i = _closing(tokens, i, "[", "]")
        i += 1
    return names


def _closing(tokens: list[tuple[str, str]], start: int, opening: str, closing: str) -> int:
    """The index of the token closing the bracket at ``start``."""
    depth = 0
    for index in range(start, len(tokens)):
        text = tokens[index][1]
        depth += (text == opening) - (text == closing)
        if depth == 0:
            return index
    raise ValueError(f"unbalanced {opening!r} in PromQL")


def _name_matchers(tokens: list[tuple[str, str]]) -> set[str]:
    """Values of ``__name__="..."`` among a selector's matchers."""
    return {
        _unquote(tokens[i + 2][1])
        for i in range(len(tokens) - 2)
        if tokens[i] == ("ident", "__name__")
        and tokens[i + 1][1] == "="
        and tokens[i + 2][0] == "string"
    }


def _family_samples(family_name: str, family_type: str) -> set[str]:
    """Every sample name a family of this type exposes (as prometheus_client writes them)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
        "summary": ("", "_count", "_sum", "_created"),
        "info": ("_info",),
    }.get(family_type, ("",))
    return {family_name + suffix for suffix in suffixes}


def _registry_series(registry: CollectorRegistry) -> set[str]:
    return {
        name for family in registry.collect() for name in _family_samples(family.name, family.type)
    }


_GATEWAY_CONFIG = """
models:
  - name: m
    backends:
      - {name: b0, url: "http://127.0.0.1:9", engine: vllm}
    max_concurrency: 8
    adaptive: {mode: kv_cache, floor: 2}
    lanes:
      - {name: interactive, max_concurrency: 8}
      - {name: batch, max_concurrency: 4}
tenants:
  - {name: t, api_key_env: SLUICEGATE_PROMQL_TENANT_KEY}
store: redis://127.0.0.1:9/0
pressure:
  prometheus_url: http://127.0.0.1:9
  signals:
    - {name: kueue_backlog, query: 'sum(kueue_pending_workloads)', threshold: 10}
"""


@cache
def exported_series() -> frozenset[str]:
    """Every sample name sluicegate's gateway and emulator can export.

    Built from the real collectors, not a list: a gateway over a small config with an
    adaptive limit, tenants, a shared store (distributed mode's metrics; nothing connects)
    and ``pressure:``; the ``sluicegate_worker_up`` family that ``serve --workers`` adds; and
    an emulator's vLLM-named registry. Counters and histograms are expanded to the sample
    names prometheus_client writes (``_total``, ``_bucket``, ``_sum``, ``_count``,
    ``_created``).
    """
    from sluicegate.config import parse_config
    from sluicegate.emulator.personalities.vllm_metrics import EmulatorMetrics
    from sluicegate.engine import Engine, preset
    from sluicegate.gateway.distributed.siblings import worker_up_family
    from sluicegate.gateway.state import GatewayState

    state = GatewayState(
        parse_config(_GATEWAY_CONFIG), {"SLUICEGATE_PROMQL_TENANT_KEY": "sk-promql-helper"}
    )
    names = _registry_series(state.metrics.registry)
    for family in text_string_to_metric_families(worker_up_family({0: True})):
        names |= _family_samples(family.name, family.type)
    names |= _registry_series(EmulatorMetrics("m", Engine(preset("tiny"))).registry)
    return frozenset(names)


def _rules(path: Path) -> Iterator[dict[str, Any]]:
    document = yaml.safe_load(path.read_text())
    for group in document["groups"]:
        yield from group["rules"]


def recorded_names(rules_path: Path = RULES) -> set[str]:
    """The names the recording rules of a Prometheus rules file record."""
    return {rule["record"] for rule in _rules(rules_path) if "record" in rule}


def rule_expressions(rules_path: Path = RULES) -> list[tuple[str, str]]:
    """``(record or alert name, expr)`` of every rule of a Prometheus rules file."""
    return [(rule.get("record") or rule["alert"], str(rule["expr"])) for rule in _rules(rules_path)]


GRAFANA_DEFAULTS: Mapping[str, str] = {
    "datasource": "prometheus",
    "model": ".+",
    "lane": ".+",
    "__rate_interval": "1m",
    "__interval": "1m",
    "__range": "5m",
}
"""What :func:`grafana_expressions` puts for each template variable by default: every model
and lane (as Grafana's "All" does with a ``.+`` custom all-value) and one-minute windows."""

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # a collapsed row holds its panels


def grafana_panels(path: Path = DASHBOARD) -> list[dict[str, Any]]:
    """Every panel of a dashboard, those inside collapsed rows included."""
    return list(_panels(json.loads(path.read_text())["panels"]))


def grafana_expressions(
    path: Path = DASHBOARD, variables: Mapping[str, str] = GRAFANA_DEFAULTS
) -> list[str]:
    """Every panel target's ``expr`` with template variables (``$v``, ``${v}``, ``${v:fmt}``,
    ``[[v]]``) replaced from ``variables``; an unknown variable raises KeyError."""

    def substitute(match: re.Match[str]) -> str:
        return variables[next(group for group in match.groups() if group)]

    return [
        _VARIABLE.sub(substitute, target["expr"])
        for panel in grafana_panels(path)
        for target in panel.get("targets", [])
        if target.get("expr")
    ]
