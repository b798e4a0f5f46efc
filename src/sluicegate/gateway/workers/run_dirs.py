"""The ``serve --workers`` supervisor's private run directory, and what a killed one left.

``make_run_dir`` creates ``sluicegate-workers-*`` (mode 0700) in the temporary
directory and records in it who owns it: the supervisor's pid and that process's
start time (``/proc/<pid>/stat``), so a pid the kernel has since reused is not
mistaken for it. A supervisor stopped by a signal it can catch removes its
directory; one killed with ``SIGKILL`` cannot, so ``remove_stale_run_dirs`` runs
at every start and removes the directories whose owner is no longer running.

Only what is certainly stale goes: a directory of this user (not a symlink) that
records an owner, whose owner is gone (no such pid, a zombie, or another process
started since under that pid). A directory without a readable record (one being
created now, or made by an older version) and every live gateway's are left alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

PREFIX = "sluicegate-workers-"
OWNER_FILE = "supervisor.pid"
"""``<pid> <start time in clock ticks since boot>``, one line."""
MAX_OWNER_BYTES = 64

_log = logging.getLogger("sluicegate.workers")


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None if it is not running (no
    such process, or a zombie)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses.
    fields = raw[raw.rfind(b")") + 2 :].split()
    if not fields or fields[0] == b"Z":
        return None
    return int(fields[19])


def make_run_dir() -> Path:
    """A new private run directory that records this process as its owner."""
    run_dir = Path(tempfile.mkdtemp(prefix=PREFIX))
    pid = os.getpid()
    partial = run_dir / (OWNER_FILE + ".part")
    partial.write_text(f"{pid} {start_time(pid)}\n")
    partial.replace(run_dir / OWNER_FILE)  # never read half written
    return run_dir


def _owner(run_dir: Path) -> tuple[int, int] | None:
    """The (pid, start time) ``run_dir`` records, or None when it records none."""
    try:
        fd = os.open(run_dir / OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as record:
        words = record.read(MAX_OWNER_BYTES).split()
    if len(words) != 2 or not all(w.isdigit() for w in words):
        return None
    return int(words[0]), int(words[1])


def is_stale(run_dir: Path) -> bool:
    """Whether ``run_dir`` is this user's and records an owner that is no longer running."""
    try:
        info = run_dir.lstat()
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return False
    owner = _owner(run_dir)
    if owner is None:
        return False
    pid, started = owner
    return start_time(pid) != started


def remove_stale_run_dirs(parent: Path | None = None) -> list[Path]:
    """Remove the run directories in ``parent`` (default: the temporary directory) whose
    supervisor was killed; those removed, each logged once."""
    where = Path(parent or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for run_dir in where.glob(PREFIX + "*"):
            if is_stale(run_dir):
                shutil.rmtree(run_dir, ignore_errors=True)
                _log.info("removed %s, left by a supervisor that was killed", run_dir)
                removed.append(run_dir)
    return removed
