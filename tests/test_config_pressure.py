"""The ``pressure:`` section and lanes' ``pressure_floor``: a good config parses; each bad
field is refused naming its dotted path and the line it is on, as every other config error."""

from __future__ import annotations

import pytest

from sluicegate.config import ConfigError, parse_config

# Block style, as operators write it; the line numbers below count from 1 at "models:".
GOOD = """\
models:
  - name: m
    max_concurrency: 8
    lanes:
      - name: interactive
        max_concurrency: 8
        pressure_floor: 4
      - name: batch
        max_concurrency: 4
pressure:
  prometheus_url: http://prometheus.monitoring:9090/
  interval_s: 5
  timeout_s: 2
  signals:
    - name: kueue_backlog
      query: sum(kueue_pending_workloads{cluster_queue="gpu"})
      threshold: 10
      clear_below: 5
    - name: gpu_busy
      query: avg(DCGM_FI_DEV_GPU_UTIL)
      threshold: 95
"""
LINE = {
    "pressure_floor": 7,
    "prometheus_url": 11,
    "interval_s": 12,
    "timeout_s": 13,
    "signals": 15,
    "clear_below": 18,
    "second_name": 19,
}


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    return str(info.value)


def test_a_good_pressure_config_parses() -> None:
    """Every field of the example is read as written; the URL loses its trailing slash;
    ``clear_below`` defaults to unset (the threshold); an unset floor stays unset."""
    config = parse_config(GOOD)
    pressure = config.pressure
    assert pressure is not None
    assert pressure.prometheus_url == "http://prometheus.monitoring:9090"
    assert (pressure.interval_s, pressure.timeout_s) == (5.0, 2.0)
    assert [(s.name, s.threshold, s.clear_below) for s in pressure.signals] == [
        ("kueue_backlog", 10.0, 5.0),
        ("gpu_busy", 95.0, None),
    ]
    assert pressure.signals[0].query == 'sum(kueue_pending_workloads{cluster_queue="gpu"})'
    lanes = config.models[0].lanes
    assert [lane.pressure_floor for lane in lanes] == [4, None]


def test_without_a_pressure_section_there_is_none() -> None:
    """``pressure`` is optional and absent by default."""
    assert parse_config("models: [{name: m}]\n").pressure is None


def test_https_prometheus_with_a_path_prefix_is_accepted() -> None:
    """A Prometheus behind a path prefix over https (e.g. a proxy) is a valid base URL."""
    text = GOOD.replace("http://prometheus.monitoring:9090/", "https://mon.example:443/prom")
    pressure = parse_config(text).pressure
    assert pressure is not None
    assert pressure.prometheus_url == "https://mon.example:443/prom"


def test_clear_below_above_threshold_names_clear_below_and_its_line() -> None:
    """``clear_below`` above its signal's ``threshold`` would never loosen: refused at the
    ``clear_below`` field, with both values in the message."""
    message = _error(GOOD.replace("clear_below: 5", "clear_below: 11"))
    assert f"pressure.signals[0].clear_below (line {LINE['clear_below']})" in message, message
    assert "(11.0)" in message, message
    assert "(10.0)" in message, message


def test_duplicate_signal_names_name_signals_and_the_name() -> None:
    """Two signals with one name (their gauges would collide) are refused at ``signals``,
    naming the duplicate."""
    message = _error(GOOD.replace("name: gpu_busy", "name: kueue_backlog"))
    assert f"pressure.signals (line {LINE['signals']})" in message, message
    assert "kueue_backlog" in message, message


def test_timeout_above_interval_names_timeout_s_and_its_line() -> None:
    """A poll timeout longer than the poll period is refused at ``timeout_s``."""
    message = _error(GOOD.replace("timeout_s: 2", "timeout_s: 6"))
    assert f"pressure.timeout_s (line {LINE['timeout_s']})" in message, message
    assert "interval_s" in message, message


@pytest.mark.parametrize(
    "url",
    [
        "prometheus:9090",
        "ftp://prometheus:9090",
        "http://",
        "'http://prometheus:9090/api/v1/query?query=up'",
        "'http://prometheus:9090/?x=1'",
    ],
    ids=["no-scheme", "ftp", "no-host", "api-query", "query"],
)
def test_bad_prometheus_url_names_the_field_and_its_line(url: str) -> None:
    """Without an http(s) scheme, without a host, or with a query string, the URL is
    refused at ``prometheus_url``; the message says what is expected."""
    message = _error(GOOD.replace("http://prometheus.monitoring:9090/", url))
    assert f"pressure.prometheus_url (line {LINE['prometheus_url']})" in message, message
    assert "http://" in message, message


def test_pressure_floor_above_lane_cap_names_pressure_floor_and_its_line() -> None:
    """A lane's ``pressure_floor`` above its ``max_concurrency`` is refused at the
    ``pressure_floor`` field, with both values in the message."""
    message = _error(GOOD.replace("pressure_floor: 4", "pressure_floor: 9"))
    where = f"models[0].lanes[0].pressure_floor (line {LINE['pressure_floor']})"
    assert where in message, message
    assert "(9)" in message, message
    assert "(8)" in message, message


def test_negative_pressure_floor_is_refused() -> None:
    """A floor below 0 is refused at the field (0 closes a lane; below means nothing)."""
    message = _error(GOOD.replace("pressure_floor: 4", "pressure_floor: -1"))
    assert f"models[0].lanes[0].pressure_floor (line {LINE['pressure_floor']})" in message


def test_pressure_floor_equal_to_lane_cap_is_accepted() -> None:
    """A floor equal to the lane's cap (never tightened) is valid."""
    config = parse_config(GOOD.replace("pressure_floor: 4", "pressure_floor: 8"))
    assert config.models[0].lanes[0].pressure_floor == 8


def test_empty_signals_are_refused_at_signals() -> None:
    """A pressure loop with nothing to poll is refused at ``signals``."""
    head = GOOD.split("  signals:\n")[0]
    message = _error(head + "  signals: []\n")
    assert f"pressure.signals (line {LINE['signals'] - 1})" in message, message


def test_missing_signals_and_url_are_each_named() -> None:
    """``prometheus_url`` and ``signals`` are required; both are listed at once."""
    message = _error("models: [{name: m}]\npressure:\n  interval_s: 5\n")
    assert "pressure.prometheus_url" in message, message
    assert "pressure.signals" in message, message


def test_unknown_pressure_key_is_refused() -> None:
    """A misspelt key under ``pressure`` or a signal is an error, not silently ignored."""
    assert "intervall_s" in _error(GOOD.replace("interval_s: 5", "intervall_s: 5"))
    assert "treshold" in _error(GOOD.replace("threshold: 95", "treshold: 95"))
