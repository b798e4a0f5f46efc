"""The native build of the scheduler's hot path with mypyc, on by default for wheels.

The same typed source runs as plain Python or compiled to C extensions
(benchmarks/bench_core.py measures both: 2-3× faster per ticket). What a build does
is set by ``SLUICEGATE_COMPILE``:

- unset (the default): a wheel (``pip install .``, ``pip wheel .``) compiles the
  modules below when mypyc and a C compiler with the Python headers are present, and
  falls back to plain Python, with a warning, when they are not or the build fails.
  An editable install (``pip install -e .``, ``make install``) stays plain Python: a
  compiled module would shadow the source being edited.
- ``1``: compile, editable or not, and fail the build if compiling fails.
- ``0``: never compile.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

COMPILED = [
    "src/sluicegate/core/" + name
    for name in (
        "admission.py",
        "backend_state.py",
        "circuit.py",
        "decisions.py",
        "entry.py",
        "estimate.py",
        "fair_queue.py",
        "intake.py",
        "predictor.py",
        "preemption.py",
        "queues.py",
        "policies/policy.py",
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
        "scheduler_state.py",
        "tenant_share.py",
        "ticket.py",
        "work_ahead.py",
    )
]
SETTING = os.environ.get("SLUICEGATE_COMPILE", "")


def _warn(message: str) -> None:
    print(f"sluicegate: {message}; the scheduler runs as plain Python", file=sys.stderr)


def _can_compile() -> bool:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        _warn(f"no C compiler ({compiler})")
        return False
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        _warn("no Python headers (Python.h)")
        return False
    return True


# The setuptools commands that build extensions; pip's metadata steps (egg_info,
# dist_info) and editable installs (editable_wheel) need no mypyc run.
BUILDS = {"bdist_wheel", "build_ext", "build", "install", "bdist"}


def _ext_modules() -> list[Any]:
    if SETTING == "0":
        return []
    if SETTING != "1" and (not BUILDS & set(sys.argv[1:]) or not _can_compile()):
        return []
    try:
        from mypyc.build import mypycify

        return list(mypycify(COMPILED, opt_level="3"))
    except (ImportError, SystemExit, Exception) as exc:
        # mypyc exits on a type error (a newer mypy may find one); the core still runs.
        if SETTING == "1":
            raise
        _warn(f"mypyc could not compile the core ({exc!r})")
        return []


class OptionalBuildExt(build_ext):
    """``build_ext`` that, unless compiling was asked for, drops the extensions when
    they fail to build instead of failing the install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            if SETTING == "1":
                raise
            for output in self.get_outputs():
                Path(output).unlink(missing_ok=True)
            self.extensions = []
            self.distribution.ext_modules = []
            _warn(f"compiling failed ({exc})")


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
