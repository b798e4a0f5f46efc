"""A real ``/usr/bin/prometheus`` for the live test: started on a given loopback port with
1 s scrapes and rule evaluation, and the parts of its HTTP API the test reads."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import yaml

from tests.distributed.cluster import Child, stop_children, wait_ready

PROMETHEUS_BINARY = Path("/usr/bin/prometheus")
SCRAPE_INTERVAL_S = 1.0
"""Prometheus's scrape and rule-evaluation interval."""


def get_json(url: str, *, headers: Mapping[str, str] | None = None) -> Any:
    """``GET url`` and its JSON body (raises ``HTTPError`` on 4xx/5xx)."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    with urllib.request.urlopen(request, timeout=5) as response:
        return orjson.loads(response.read())


class Prometheus:
    """A running ``/usr/bin/prometheus`` and the parts of its HTTP API the test uses."""

    def __init__(self, child: Child) -> None:
        self.child = child

    @property
    def url(self) -> str:
        """Its base URL (what the gateway's ``pressure.prometheus_url`` names)."""
        return self.child.url

    def query(self, expr: str) -> list[dict[str, Any]]:
        """``/api/v1/query`` of ``expr`` now: the result vector (a scalar as one sample)."""
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            body = get_json(url)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"Prometheus refused {expr!r}: {exc.read()!r}") from exc
        data = body["data"]
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def values(self, expr: str) -> list[float]:
        """The sample values ``expr`` returns now (NaN included)."""
        return [float(sample["value"][1]) for sample in self.query(expr)]

    def value(self, expr: str) -> float:
        """The single value of ``expr`` now; fails unless exactly one sample comes back."""
        found = self.values(expr)
        assert len(found) == 1, f"{expr!r} returned {len(found)} samples: {self.query(expr)}"
        return found[0]

    def alerts(self) -> list[dict[str, Any]]:
        """``/api/v1/alerts``: the pending and firing alerts."""
        alerts: list[dict[str, Any]] = get_json(self.url + "/api/v1/alerts")["data"]["alerts"]
        return alerts

    def targets(self) -> list[dict[str, Any]]:
        """``/api/v1/targets``' active targets."""
        active: list[dict[str, Any]] = get_json(self.url + "/api/v1/targets")["data"][
            "activeTargets"
        ]
        return active

    def wait_all_up(self, timeout_s: float = 15.0) -> None:
        """Wait until every target has been scraped successfully at least once."""
        deadline = time.monotonic() + timeout_s
        while True:
            targets = self.targets()
            if targets and all(t["health"] == "up" for t in targets):
                return
            if time.monotonic() > deadline:
                states = [(t["labels"]["job"], t["health"], t["lastError"]) for t in targets]
                raise AssertionError(f"Prometheus targets not all up: {states}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop it (the gateway's pressure queries fail from now on)."""
        stop_children([self.child])


def prometheus_config(jobs: Mapping[str, str], rule_files: list[Path]) -> dict[str, Any]:
    """Prometheus's configuration: 1 s scrapes and rule evaluation, one static target per job."""
    interval = f"{SCRAPE_INTERVAL_S:g}s"
    return {
        "global": {
            "scrape_interval": interval,
            "evaluation_interval": interval,
            "scrape_timeout": interval,
        },
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [target]}]}
            for job, target in jobs.items()
        ],
    }


def start_prometheus(
    log_dir: Path, port: int, jobs: Mapping[str, str], rule_files: list[Path]
) -> Prometheus:
    """Run Prometheus on ``port`` scraping ``jobs`` (job name → ``host:port``); wait for
    ``/-/ready``."""
    if not PROMETHEUS_BINARY.exists():
        raise AssertionError(
            f"{PROMETHEUS_BINARY} is missing: `make test` installs Debian's `prometheus` "
            "package (apt-get install prometheus)"
        )
    config = log_dir / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(jobs, rule_files), sort_keys=False))
    argv = [
        str(PROMETHEUS_BINARY),
        f"--config.file={config}",
        f"--storage.tsdb.path={log_dir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    log = log_dir / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    child = Child("prometheus", port, proc, log)
    try:
        wait_ready([(child, "/-/ready")])
    except BaseException:
        stop_children([child])
        raise
    return Prometheus(child)
