"""A supervisor killed with ``SIGKILL`` leaves its run directory; the next one removes it,
and never a directory a live gateway (or a process it cannot be sure of) still owns."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluicegate.demo.processes import free_port
from sluicegate.gateway.workers.run_dirs import (
    OWNER_FILE,
    PREFIX,
    remove_stale_run_dirs,
    start_time,
)
from tests.distributed.cluster import stop_children, wait_ready
from tests.workers.fleet import (
    descendants,
    run_dir_of,
    start_engine,
    start_supervisor,
    wait_until_gone,
    wait_workers,
    write_config,
)

pytestmark = pytest.mark.workers


@pytest.fixture
def tmpdir_root() -> Iterator[Path]:
    """A private TMPDIR for the supervisors (short: the Redis socket path lives in it)."""
    root = Path(tempfile.mkdtemp(prefix="sgw-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def dead_pid() -> int:
    """The pid of a process that has just exited (and been reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def run_dir(root: Path, name: str, owner: str | None) -> Path:
    """A run directory under ``root`` recording ``owner`` (none when None)."""
    path = root / f"{PREFIX}{name}"
    path.mkdir(mode=0o700)
    (path / "redis.sock").write_text("")
    if owner is not None:
        (path / OWNER_FILE).write_text(owner + "\n")
    return path


def test_only_dirs_whose_owner_is_gone_are_removed(tmp_path: Path) -> None:
    """Removed: a dead pid's, and a pid alive now but started at another time (reused).
    Kept: this live process's, one without an owner record, a garbled record, a symlink
    to a stale one, and a directory not named like a run directory."""
    me = os.getpid()
    mine = start_time(me)
    dead = run_dir(tmp_path, "dead", f"{dead_pid()} 12345")
    reused = run_dir(tmp_path, "reused", f"{me} {mine - 1 if mine else 1}")
    live = run_dir(tmp_path, "live", f"{me} {mine}")
    unknown = run_dir(tmp_path, "unknown", None)
    garbled = run_dir(tmp_path, "garbled", "12 x")
    other = tmp_path / "other-dir"
    other.mkdir()
    (other / OWNER_FILE).write_text(f"{dead_pid()} 1\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = run_dir(elsewhere, "t", f"{dead_pid()} 1")
    link = tmp_path / f"{PREFIX}link"
    link.symlink_to(target)
    removed = remove_stale_run_dirs(tmp_path)
    assert sorted(removed) == sorted([dead, reused])
    assert not dead.exists()
    assert not reused.exists()
    for kept in (live, unknown, garbled, other, target, link):
        assert kept.exists(), kept


def test_a_killed_supervisors_dir_goes_at_the_next_start_and_a_live_ones_stays(
    tmp_path: Path, tmpdir_root: Path
) -> None:
    """``serve --workers 2`` killed with SIGKILL: its workers exit and its run directory
    stays. The next ``serve --workers 2`` removes it (and says so); a third, started while
    the second runs, leaves the second's in place and the second keeps serving."""
    env = {"TMPDIR": str(tmpdir_root)}
    engine = start_engine(tmp_path)
    children = [engine]
    try:
        port = free_port()
        config = write_config(tmp_path, "gateway", port=port, engine_port=engine.port)
        first = start_supervisor(tmp_path, config, port, 2, env)
        children.append(first)
        wait_ready([(engine, "/health"), (first, "/readyz")])
        first_dir = run_dir_of(wait_workers(first, 2)[0])
        assert first_dir.parent == tmpdir_root
        assert (first_dir / OWNER_FILE).read_text().split()[0] == str(first.proc.pid)
        tree = descendants(first.proc.pid)
        first.proc.kill()
        first.proc.wait(timeout=5)
        assert wait_until_gone(tree, 10.0) == [], tree
        assert first_dir.exists()

        second = start_supervisor(tmp_path, config, port, 2, env)
        children.append(second)
        second_dir = run_dir_of(wait_workers(second, 2)[0])
        assert not first_dir.exists()
        assert f"removed {first_dir}, left by a supervisor that was killed" in second.log_tail()

        third_port = free_port()
        third_config = write_config(tmp_path, "third", port=third_port, engine_port=engine.port)
        third = start_supervisor(tmp_path, third_config, third_port, 2, env)
        children.append(third)
        third_dir = run_dir_of(wait_workers(third, 2)[0])
        assert second_dir.exists()
        assert (second_dir / "redis.sock").exists()
        assert sorted(tmpdir_root.iterdir()) == sorted([second_dir, third_dir])
        assert len(wait_workers(second, 2)) == 2  # still serving
    finally:
        stop_children(children[::-1])
