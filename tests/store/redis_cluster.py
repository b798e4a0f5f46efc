"""A private Redis Cluster for tests: six ``redis-server --cluster-enabled yes`` on free
loopback ports, three masters with one replica each (``redis-cli --cluster create``).

``running_cluster()`` starts one in a temporary directory and kills every node on exit.
The ``RedisCluster`` it yields names the nodes, tells which master owns a key's slot,
kills a master (``kill -9``) and waits until its replica has taken over.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence

import redis
from redis.crc import key_slot

from tests.store.redis_server import RedisServer, free_port

__all__ = ["REDIS_CLI", "RedisCluster", "running_cluster"]

REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
"""The ``redis-cli`` that creates the cluster (it ships with redis-server)."""
NODE_TIMEOUT_MS = 1000
"""``cluster-node-timeout``: a master silent this long is failing; its replica takes over
about one to two timeouts later."""
_READY_TIMEOUT_S = 30.0


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=2.0, decode_responses=True)


class RedisCluster:
    """Six nodes on ``127.0.0.1``: their servers and who is master of what."""

    def __init__(self, servers: Sequence[RedisServer]) -> None:
        self.servers = list(servers)

    @property
    def url(self) -> str:
        """A store URL naming the first node (a seed: any node will do)."""
        return self.alive()[0].url

    def server(self, port: int) -> RedisServer:
        """The node listening on ``port``."""
        return next(server for server in self.servers if server.port == port)

    def alive(self) -> list[RedisServer]:
        """The nodes not killed."""
        return [server for server in self.servers if server.running]

    def owner(self, key: str) -> int:
        """The port of the master serving ``key``'s slot, as a live node sees it."""
        slot = key_slot(key.encode())
        with _client(self.alive()[0].port) as client:
            for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
                if int(start) <= slot <= int(end):
                    return int(master[1])
        raise LookupError(f"no master serves slot {slot}")

    def masters(self) -> list[int]:
        """The ports of the masters, in slot order."""
        with _client(self.alive()[0].port) as client:
            slots = sorted(client.execute_command("CLUSTER SLOTS"), key=lambda row: int(row[0]))
        return list(dict.fromkeys(int(row[2][1]) for row in slots))

    def flush(self) -> None:
        """Empty every master (and so, by replication, every replica)."""
        for port in self.masters():
            with _client(port) as client:
                client.flushall()

    def wait_ready(self, timeout_s: float = _READY_TIMEOUT_S) -> None:
        """Until every live node says ``cluster_state:ok``, all agree on the masters, and every
        replica's link to its master is up (a replica out of sync could not take over)."""
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            if time.monotonic() > deadline:
                raise RuntimeError("the test cluster did not become ready")
            time.sleep(0.05)

    def _ready(self) -> bool:
        views = []
        try:
            for server in self.alive():
                with _client(server.port) as client:
                    if client.cluster("info")["cluster_state"] != "ok":
                        return False
                    info = client.info("replication")
                    if info["role"] == "slave" and info.get("master_link_status") != "up":
                        return False
                    rows = client.execute_command("CLUSTER SLOTS")
                    views.append(sorted((int(r[0]), int(r[1]), int(r[2][1])) for r in rows))
        except redis.RedisError:
            return False
        return all(view == views[0] and view for view in views)

    def kill_master(self, port: int) -> None:
        """``kill -9`` the master on ``port``."""
        self.server(port).kill()

    def replica_of(self, port: int) -> int:
        """The port of a live replica of the master on ``port``."""
        for server in self.alive():
            with _client(server.port) as client:
                info = client.info("replication")
            if info["role"] == "slave" and int(info["master_port"]) == port:
                return server.port
        raise LookupError(f"the master on {port} has no live replica")

    def keys_on_distinct_masters(self, count: int, key_of: Callable[[str], str]) -> list[str]:
        """``count`` names (``n0``, ``n1``…) whose keys ``key_of(name)`` live on ``count``
        different masters."""
        names: dict[int, str] = {}
        for number in range(10_000):
            name = f"n{number}"
            names.setdefault(self.owner(key_of(name)), name)
            if len(names) == count:
                return list(names.values())
        raise LookupError(f"fewer than {count} masters")


def _create(ports: Sequence[int]) -> None:
    command = [REDIS_CLI, "--cluster", "create", *(f"127.0.0.1:{port}" for port in ports)]
    command += ["--cluster-replicas", "1", "--cluster-yes"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout}{done.stderr}")


@contextlib.contextmanager
def running_cluster(nodes: int = 6) -> Iterator[RedisCluster]:
    """Start ``nodes`` cluster nodes (masters and one replica each), create the cluster and
    wait until it is ready; kill every node on exit."""
    with tempfile.TemporaryDirectory(prefix="sluicegate-cluster-") as workdir:
        servers = []
        try:
            for _ in range(nodes):
                port = free_port()
                # The bus on a free port of its own: port + 10000, its default, may be taken.
                args = ["--cluster-enabled", "yes", "--cluster-port", str(free_port())]
                args += ["--cluster-config-file", f"nodes-{port}.conf"]
                args += ["--cluster-node-timeout", str(NODE_TIMEOUT_MS)]
                # A replica's first sync starts at once, not after diskless sync's 5 s delay.
                args += ["--repl-diskless-sync-delay", "0"]
                server = RedisServer(port, workdir, args)
                server.start()
                servers.append(server)
            _create([server.port for server in servers])
            cluster = RedisCluster(servers)
            cluster.wait_ready()
            yield cluster
        finally:
            for server in servers:
                server.kill()
