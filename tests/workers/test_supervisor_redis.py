"""The supervisor keeps the private Redis running even when a restart fails."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

from sluicegate.gateway.workers.private_redis import PrivateRedis, answers_ping
from sluicegate.gateway.workers.supervisor import BACKOFF_MIN_S, Supervisor

REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"


def _flaky_redis(tmp_path: Path) -> Path:
    """A ``redis-server`` whose second start fails (exit 1); the others run the real one."""
    script = tmp_path / "redis-server"
    count = tmp_path / "starts"
    script.write_text(
        "#!/bin/sh\n"
        f'n=$(cat "{count}" 2>/dev/null || echo 0)\n'
        f'echo $((n + 1)) > "{count}"\n'
        'if [ "$n" = 1 ]; then exit 1; fi\n'
        f'exec "{REDIS}" "$@"\n'
    )
    script.chmod(0o755)
    return script


def test_a_failed_restart_of_the_private_redis_is_tried_again(tmp_path: Path) -> None:
    """Redis is killed; the supervisor's first restart fails (the binary exits 1), so it
    is not answering; ``BACKOFF_MIN_S`` later the supervisor starts it again and it
    answers ``PING``. Three starts in all."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    redis = PrivateRedis(str(_flaky_redis(tmp_path)), run_dir)
    supervisor = Supervisor(
        config_path=tmp_path / "unused.yaml", count=0, host="127.0.0.1", port=0,
        store=redis.url, replica_base="r", run_dir=run_dir, redis=redis,
    )  # fmt: skip
    redis.start()
    try:
        assert redis.process is not None
        redis.process.send_signal(signal.SIGKILL)
        redis.process.wait(timeout=5)
        supervisor._watch()  # the restart fails
        assert not answers_ping(redis.socket_path)
        time.sleep(BACKOFF_MIN_S + 0.1)
        supervisor._watch()  # tried again
        assert answers_ping(redis.socket_path)
        assert (tmp_path / "starts").read_text().strip() == "3"
    finally:
        redis.stop()
