"""Optional native build of the scheduler's hot path with mypyc.

The same typed source runs as plain Python by default. With
``SLUICEGATE_COMPILE=1`` (and mypy installed in the build environment, e.g.
``SLUICEGATE_COMPILE=1 pip install --no-build-isolation .``) the modules below
are compiled to C extensions; benchmarks/bench_core.py measures both.
"""

from __future__ import annotations

import os

from setuptools import setup

COMPILED = [
    "src/sluicegate/core/" + name
    for name in (
        "admission.py",
        "backend.py",
        "circuit.py",
        "decisions.py",
        "entry.py",
        "estimate.py",
        "fair_queue.py",
        "intake.py",
        "predictor.py",
        "preemption.py",
        "queues.py",
        "policies/base.py",
        "policies/fifo.py",
        "policies/oracle.py",
        "policies/priority.py",
        "policies/sjf.py",
        "policies/slack.py",
        "policies/slack_oracle.py",
        "ratelimit.py",
        "routing/least_inflight.py",
        "runtime.py",
        "scheduler.py",
        "tenant_share.py",
        "ticket.py",
        "work_ahead.py",
    )
]


def _ext_modules() -> list[object]:
    if os.environ.get("SLUICEGATE_COMPILE") != "1":
        return []
    from mypyc.build import mypycify

    return list(mypycify(COMPILED, opt_level="3"))


setup(ext_modules=_ext_modules())
