"""The Prometheus rules and the Grafana dashboard we ship: promtool checks them and runs their
unit tests, every metric they name is one sluicegate exports (or a rule records), every alert
is documented, unit-tested firing and not firing, and the dashboard has the issue's panels."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.promql import (
    DASHBOARD,
    EXTERNAL_SERIES,
    REPO,
    RULES,
    exported_series,
    grafana_expressions,
    grafana_panels,
    metric_names,
    recorded_names,
    rule_expressions,
)

RULE_TESTS = sorted((REPO / "deploy" / "prometheus" / "tests").glob("*.yml"))
OPERATIONS = REPO / "docs" / "OPERATIONS.md"
SEVERITIES = {"critical", "warning", "info"}


def _promtool(*args: str) -> None:
    """Run promtool; fail with its output unless it exits 0."""
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail(
            "promtool is not installed: `make test` installs it (Debian's prometheus package:"
            " apt-get install prometheus)"
        )
    done = subprocess.run(
        [binary, *args], capture_output=True, text=True, timeout=60, check=False, cwd=REPO
    )
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


def _alerts() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def _github_slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces
    to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _heading_slugs(markdown: str) -> set[str]:
    """Slugs of every heading outside fenced code blocks."""
    slugs: set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6} (.+)", line)):
            slugs.add(_github_slug(match.group(1)))
    return slugs


# --- promql.py -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ("vllm:num_requests_running{engine='0'}", {"vllm:num_requests_running"}),
        (
            'sum by (model, le) (rate(sluicegate_queue_wait_seconds_bucket{lane=~"a|b"}[5m]))',
            {"sluicegate_queue_wait_seconds_bucket"},
        ),
        (
            "a:b:c > on (model, lane) group_left (slo) max without (worker) (d) and bool e",
            {"a:b:c", "d", "e"},
        ),
        (
            '{__name__="kueue_pending_workloads", status="pending"} offset 5m',
            {"kueue_pending_workloads"},
        ),
        ('{__name__=~"sluicegate_.*"}', set()),
        ("rate(x[5m:30s] @ start()) unless ignoring (worker) y # z is a comment", {"x", "y"}),
        (
            'label_replace(count_values("sum", m) , "dst", "$1", "src", "(.*)") / 1e3 + Inf',
            {"m"},
        ),
        ("histogram_quantile(0.99, sum(rate(q_bucket[1h30m])) by (le)) > 0.5", {"q_bucket"}),
        ("topk(3, sum by (on) (o)) or vector(0) - time()", {"o"}),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    """Functions, aggregators, keywords, label lists, strings, durations and comments are not
    metric names; ``__name__="..."`` is, a regex on ``__name__`` names none."""
    assert metric_names(expr) == names


def test_exported_series_are_what_the_collectors_write() -> None:
    """Sample names as scraped: counters with ``_total``, histograms with ``_bucket``, the
    store's, ``--workers``' and the emulator's families included, no bare counter name."""
    exported = exported_series()
    expected = {
        "sluicegate_requests_total",
        "sluicegate_queue_wait_seconds_bucket",
        "sluicegate_queue_wait_seconds_count",
        "sluicegate_backend_healthy",
        "sluicegate_store_global",
        "sluicegate_store_transitions_total",
        "sluicegate_worker_up",
        "vllm:num_requests_waiting",
        "vllm:gpu_cache_usage_perc",
    }
    assert expected <= exported
    assert not {"sluicegate_requests", "sluicegate_queue_wait_seconds"} & exported


# --- rules.yml -------------------------------------------------------------------------------


def test_promtool_check_rules() -> None:
    """``promtool check rules`` accepts the rules file."""
    _promtool("check", "rules", str(RULES.relative_to(REPO)))


def test_promtool_unit_tests_pass() -> None:
    """Every promtool unit test passes (``promtool test rules deploy/prometheus/tests/*.yml``)."""
    assert RULE_TESTS
    _promtool("test", "rules", *(str(path.relative_to(REPO)) for path in RULE_TESTS))


@pytest.mark.parametrize(("name", "expr"), rule_expressions(), ids=lambda v: v[:60])
def test_rule_metrics_are_exported_or_recorded(name: str, expr: str) -> None:
    """Each metric a rule reads is exported by the gateway or the emulator, recorded by a
    recording rule, or one of the few external names (``up``, Kueue's)."""
    known = exported_series() | recorded_names() | EXTERNAL_SERIES
    names = metric_names(expr)
    assert names, f"{name} selects no metric"
    assert names <= known, f"{name} reads unknown metrics {sorted(names - known)}"


def test_recording_rules_are_named_level_metric_operations() -> None:
    """Recording rules follow Prometheus's ``level:metric:operations`` convention and are
    each recorded once."""
    records = [name for name, _ in rule_expressions() if name in recorded_names()]
    assert len(records) == len(set(records))
    for record in records:
        assert re.fullmatch(r"[a-z_]+:sluicegate_[a-z_]+:[a-z0-9_]+", record), record


def test_alerts_carry_severity_summary_description_and_runbook() -> None:
    """Every alert waits a ``for`` duration, has a severity label, summary and description
    annotations and a runbook pointing at its own heading in docs/OPERATIONS.md."""
    alerts = _alerts()
    assert len(alerts) >= 12
    for alert in alerts:
        name = alert["alert"]
        assert alert.get("for"), name
        assert alert["labels"]["severity"] in SEVERITIES, name
        annotations = alert["annotations"]
        assert annotations["summary"].strip(), name
        assert annotations["description"].strip(), name
        assert annotations["runbook"] == f"docs/OPERATIONS.md#{name.lower()}", name


def test_runbook_anchors_are_headings_of_operations_md() -> None:
    """Each runbook anchor is the GitHub slug of a heading of docs/OPERATIONS.md."""
    slugs = _heading_slugs(OPERATIONS.read_text(encoding="utf-8"))
    missing = [
        alert["alert"]
        for alert in _alerts()
        if alert["annotations"]["runbook"].partition("#")[2] not in slugs
    ]
    assert not missing, f"docs/OPERATIONS.md has no heading for {missing}"


def test_every_alert_is_unit_tested_firing_and_not_firing() -> None:
    """For every alert some promtool test case expects it to fire (with its labels and
    annotations) and some case expects it silent (below the threshold or before ``for``)."""
    firing: set[str] = set()
    silent: set[str] = set()
    for path in RULE_TESTS:
        document = yaml.safe_load(path.read_text())
        for test in document["tests"]:
            for case in test.get("alert_rule_test", []):
                expected = case.get("exp_alerts") or []
                (firing if expected else silent).add(case["alertname"])
                for alert in expected:
                    assert alert["exp_labels"]["severity"], (path.name, case["alertname"])
                    assert set(alert["exp_annotations"]) == {"summary", "description", "runbook"}
    names = {alert["alert"] for alert in _alerts()}
    assert names - firing == set(), "alerts no test fires"
    assert names - silent == set(), "alerts no test keeps silent"


# --- the Grafana dashboard -------------------------------------------------------------------

CORE_PANEL_TYPES = {"row", "timeseries", "stat", "state-timeline", "gauge", "table", "text"}


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def test_dashboard_metrics_are_exported() -> None:
    """Each metric a panel or a template variable queries is one sluicegate exports."""
    known = exported_series() | recorded_names()
    variables = [
        re.fullmatch(r"label_values\((.+), \w+\)", v["definition"].replace('"$model"', '".+"'))
        for v in _dashboard()["templating"]["list"]
        if v["type"] == "query"
    ]
    assert all(variables), "a query variable is not label_values(selector, label)"
    selectors = [match.group(1) for match in variables if match]
    for expr in grafana_expressions() + selectors:
        names = metric_names(expr)
        assert names, expr
        assert names <= known, f"{expr}: unknown metrics {sorted(names - known)}"


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    """promtool parses every panel query (as recording rules of a scratch rules file)."""
    rules = [
        {"record": f"panel:query:q{i}", "expr": e} for i, e in enumerate(grafana_expressions())
    ]
    scratch = tmp_path / "panels.yml"
    scratch.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    _promtool("check", "rules", str(scratch))


def test_dashboard_is_self_contained() -> None:
    """uid and title ``sluicegate``, a Prometheus ``datasource`` variable every panel uses,
    ``model`` and ``lane`` variables from label_values, core panel types only."""
    dashboard = _dashboard()
    assert (dashboard["uid"], dashboard["title"]) == ("sluicegate", "sluicegate")
    assert 36 <= dashboard["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == (
        "datasource",
        "prometheus",
    )
    for name in ("model", "lane"):
        assert variables[name]["definition"].startswith("label_values("), name
        assert variables[name]["definition"].endswith(f", {name})"), name
    for panel in grafana_panels():
        assert panel["type"] in CORE_PANEL_TYPES, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def _panel_queries() -> dict[str, list[str]]:
    return {
        panel["title"]: [target["expr"] for target in panel.get("targets", [])]
        for panel in grafana_panels()
    }


@pytest.mark.parametrize(
    ("what", "patterns"),
    [
        ("queue wait p50/p95/p99", [
            r"histogram_quantile\(0\.5, .*sluicegate_queue_wait_seconds_bucket",
            r"histogram_quantile\(0\.95, .*sluicegate_queue_wait_seconds_bucket",
            r"histogram_quantile\(0\.99, .*sluicegate_queue_wait_seconds_bucket",
        ]),
        ("queue depth", [r"sum by \(model, lane\) \(sluicegate_queue_depth"]),
        ("in-flight vs limit", [
            r"sluicegate_inflight_requests\{", r"sluicegate_concurrency_limit\{",
        ]),
        ("rates by outcome", [r"by \(model, lane, outcome\) \(rate\(sluicegate_requests_total"]),
        ("TTFT p50/p95", [
            r"histogram_quantile\(0\.5, .*sluicegate_time_to_first_token_seconds_bucket",
            r"histogram_quantile\(0\.95, .*sluicegate_time_to_first_token_seconds_bucket",
        ]),
        ("tokens/s per tenant", [r"by \(model, tenant, kind\) \(rate\(sluicegate_tokens_total"]),
        ("KV usage per backend", [r"by \(model, backend\) \(sluicegate_backend_kv_cache_usage"]),
        ("backend health", [r"by \(model, backend\) \(sluicegate_backend_healthy"]),
        ("pressure stage", [r"sluicegate_pressure_stage"]),
    ],
)  # fmt: skip
def test_dashboard_has_the_issues_panels(what: str, patterns: list[str]) -> None:
    """One panel shows each thing the issue lists: all of its queries in the same panel."""
    panels = [
        title
        for title, queries in _panel_queries().items()
        if all(any(re.search(p, q) for q in queries) for p in patterns)
    ]
    assert panels, f"no panel shows {what}"


def test_dashboard_panels_filter_on_the_model_and_lane_variables() -> None:
    """Every per-lane query filters on both ``$model`` and ``$lane``, every per-model query
    on ``$model`` (so the variables really select)."""
    for title, queries in _panel_queries().items():
        for query in queries:
            if re.search(r"by \([^)]*\blane\b", query):
                assert 'model=~"$model",lane=~"$lane"' in query, title
            elif re.search(r"by \([^)]*\bmodel\b", query):
                assert 'model=~"$model"' in query, title
