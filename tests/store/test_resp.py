"""``store.resp``: the lean RESP2 client, against real redis-server processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.exceptions import (
    AuthenticationError,
    ConnectionError,
    NoScriptError,
    ResponseError,
    TimeoutError,
)

from sluicegate.store.redis_url import parse_redis_url
from sluicegate.store.resp import RespClient, RespParser, encode_commands
from tests.store.redis_server import REDIS_SERVER, RedisServer, running_redis

TIMEOUT_S = 0.05
SLACK_S = 0.02


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A redis-server of this test's own, which the test may kill, pause and restart."""
    if not os.path.exists(REDIS_SERVER):
        pytest.skip(f"redis-server not installed ({REDIS_SERVER})")
    with running_redis() as running:
        yield running


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def _custom_redis(*extra: str) -> Iterator[tuple[int, Path]]:
    """A redis-server with ``extra`` options on a free port and ``<tmp>/redis.sock``."""
    if not os.path.exists(REDIS_SERVER):
        pytest.skip(f"redis-server not installed ({REDIS_SERVER})")
    with tempfile.TemporaryDirectory(prefix="sluicegate-resp-") as workdir:
        port, sock = _free_port(), Path(workdir) / "redis.sock"
        command = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        command += ["--appendonly", "no", "--dir", workdir, "--unixsocket", str(sock)]
        command += ["--unixsocketperm", "700", "--loglevel", "warning", *extra]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10.0
            while not sock.exists():
                assert process.poll() is None, "redis-server exited"
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.01)
            yield port, sock
        finally:
            process.kill()
            process.wait()


async def _run(client: RespClient, commands: list[list[Any]], timeout_s: float = 2.0) -> list[Any]:
    return await client.execute(commands, asyncio.get_running_loop().time() + timeout_s)


def test_url_forms_parse_as_redis_py_reads_them() -> None:
    """Every URL form the config accepts: host, port, db, user, password, socket, TLS."""
    plain = parse_redis_url("redis://cache:6380/3")
    assert (plain.host, plain.port, plain.db) == ("cache", 6380, 3)
    assert (plain.password, plain.tls, plain.path) == (None, None, None)
    assert parse_redis_url("redis://").host == "localhost"
    assert parse_redis_url("redis://:hunter%402@cache/0").password == "hunter@2"
    login = parse_redis_url("redis://alice:pw@cache:1/2")
    assert (login.username, login.password, login.db) == ("alice", "pw", 2)
    sock = parse_redis_url("unix:///run/redis.sock?db=4&password=pw")
    assert (sock.path, sock.db, sock.password) == ("/run/redis.sock", 4, "pw")
    assert parse_redis_url("unix://:pw@/run/r.sock").password == "pw"
    tls = parse_redis_url("rediss://cache/0?ssl_cert_reqs=none&socket_timeout=1")
    assert tls.tls == {"ssl_cert_reqs": "none"}
    bad = {
        "http://cache": "starts with",
        "redis://cache/x": "must be a number",
        "redis://cache/0?bogus=1": "unsupported",
        "unix://": "socket path",
    }
    for url, message in bad.items():
        with pytest.raises(ValueError, match=message):
            parse_redis_url(url)


async def test_every_reply_type_round_trips(redis_url: str) -> None:
    """Simple strings, integers, bulk strings (null, empty, UTF-8), nested and null arrays."""
    client = RespClient(redis_url, connect_timeout_s=1.0)
    try:
        replies = await _run(
            client,
            [
                ["PING"],
                ["SET", "k", "grüße\r\n$3"],
                ["GET", "k"],
                ["GET", "missing"],
                ["SET", "empty", b""],
                ["GET", "empty"],
                ["RPUSH", "list", 1, 2.5, "three"],
                ["LRANGE", "list", 0, -1],
                ["LRANGE", "missing", 0, -1],
                ["EVAL", "return {1, {'a', {2, false}}, -7, 'x'}", 0],
                ["EVAL", "return redis.status_reply('FINE')", 0],
                ["EVAL", "return false", 0],
                ["BLPOP", "missing", "0.01"],
            ],
        )
    finally:
        client.close()
    assert replies == [
        "PONG",
        "OK",
        "grüße\r\n$3",
        None,
        "OK",
        "",
        3,
        ["1", "2.5", "three"],
        [],
        [1, ["a", [2, None]], -7, "x"],
        "FINE",
        None,
        None,
    ]


async def test_error_replies_stay_in_their_slot(redis_url: str) -> None:
    """An error reply is an exception object in the list; the other commands still answer."""
    client = RespClient(redis_url, connect_timeout_s=1.0)
    try:
        replies = await _run(
            client,
            [["SET", "s", "v"], ["INCR", "s"], ["EVALSHA", "0" * 40, 0], ["GET", "s"], ["NOPE"]],
        )
        assert (replies[0], replies[3]) == ("OK", "v")
        assert type(replies[1]) is ResponseError
        assert "not an integer" in str(replies[1])
        assert isinstance(replies[2], NoScriptError)
        assert type(replies[4]) is ResponseError
        assert "unknown command" in str(replies[4])
        assert await _run(client, [["PING"]]) == ["PONG"]  # the connection is still good
    finally:
        client.close()


def test_replies_split_at_every_byte() -> None:
    """The parser gives the same replies whichever byte the stream is cut at (and byte by byte)."""
    stream = (
        b"+OK\r\n:-12\r\n$5\r\nhe\r\no\r\n$-1\r\n$0\r\n\r\n*-1\r\n*0\r\n"
        b"*3\r\n:1\r\n*2\r\n$1\r\na\r\n*1\r\n$-1\r\n+s\r\n-NOSCRIPT No matching script\r\n"
    )
    expected = ["OK", -12, "he\r\no", None, "", None, [], [1, ["a", [None]], "s"]]

    def check(replies: list[Any]) -> None:
        assert replies[:-1] == expected
        assert isinstance(replies[-1], NoScriptError)

    for cut in range(len(stream) + 1):
        parser = RespParser()
        check(parser.feed(stream[:cut]) + parser.feed(stream[cut:]))
    parser = RespParser()
    check([reply for i in range(len(stream)) for reply in parser.feed(stream[i : i + 1])])


def test_commands_encode_as_bulk_strings() -> None:
    """str, bytes, int and float arguments (floats as redis-py writes them)."""
    assert encode_commands([["SET", b"k", 1], ["X", 0.1]]) == (
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n1\r\n*2\r\n$1\r\nX\r\n$3\r\n0.1\r\n"
    )


async def test_a_pipeline_of_1000_commands_and_concurrent_pipelines(redis_url: str) -> None:
    """1,000 commands in one write, and 50 pipelines at once, each gets its own replies."""
    client = RespClient(redis_url, connect_timeout_s=1.0)
    try:
        replies = await _run(client, [["INCRBY", "n", i] for i in range(1000)])
        assert replies == [i * (i + 1) // 2 for i in range(1000)]
        answers = await asyncio.gather(
            *(_run(client, [["ECHO", f"{i}-{j}"] for j in range(i % 5 + 1)]) for i in range(50))
        )
        assert answers == [[f"{i}-{j}" for j in range(i % 5 + 1)] for i in range(50)]
        assert await _run(client, []) == []
    finally:
        client.close()


async def test_auth_select_and_the_unix_socket() -> None:
    """Password only and user:password, over TCP and the unix socket, with SELECT."""
    acl = ("--requirepass", "secret", "--user", "alice", "on", ">pw", "~*", "&*", "+@all")
    with _custom_redis(*acl) as (port, sock):
        urls = [
            f"redis://:secret@127.0.0.1:{port}/5",
            f"redis://alice:pw@127.0.0.1:{port}/5",
            f"unix://:secret@{sock}?db=5",
            f"unix://{sock}?db=5&username=alice&password=pw",
        ]
        for i, url in enumerate(urls):
            client = RespClient(url, connect_timeout_s=1.0)
            try:
                assert await _run(client, [["SET", f"k{i}", i]]) == ["OK"]
            finally:
                client.close()
        with redis.Redis(port=port, password="secret", db=5) as check:
            assert sorted(check.keys()) == [b"k0", b"k1", b"k2", b"k3"]
        client = RespClient(f"redis://:wrong@127.0.0.1:{port}/0", connect_timeout_s=1.0)
        with pytest.raises(AuthenticationError):  # WRONGPASS on connect
            await _run(client, [["GET", "k0"]])
        client.close()
        client = RespClient(f"unix://{sock}", connect_timeout_s=1.0)
        (refused,) = await _run(client, [["GET", "k0"]])  # no password: NOAUTH, per reply
        assert isinstance(refused, AuthenticationError)
        client.close()


async def test_tls(tmp_path: Path) -> None:
    """rediss:// with a CA file (hostname checked) and with ssl_cert_reqs=none."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    port = _free_port()
    tls = ("--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key))
    with _custom_redis(*tls, "--tls-auth-clients", "no"):
        await asyncio.sleep(0.1)
        for query in (f"ssl_ca_certs={cert}", "ssl_cert_reqs=none"):
            client = RespClient(f"rediss://127.0.0.1:{port}/0?{query}", connect_timeout_s=2.0)
            try:
                assert await _run(client, [["PING"], ["ECHO", "tls"]]) == ["PONG", "tls"]
            finally:
                client.close()
        client = RespClient(f"rediss://127.0.0.1:{port}/0", connect_timeout_s=2.0)
        with pytest.raises(ConnectionError):  # self-signed, not trusted by default
            await _run(client, [["PING"]])
        client.close()


async def test_a_killed_redis_fails_fast_and_the_client_reconnects(server: RedisServer) -> None:
    """SIGKILL: the pending call gets ConnectionError at once, new calls too; after a
    restart on the same port the next call connects again."""
    client = RespClient(server.url, connect_timeout_s=TIMEOUT_S)
    try:
        assert await _run(client, [["PING"]]) == ["PONG"]
        blocked = asyncio.ensure_future(_run(client, [["BLPOP", "nothing", 5]], timeout_s=10.0))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        server.kill()
        with pytest.raises(ConnectionError):
            await blocked
        assert time.monotonic() - started < 0.5
        started = time.monotonic()
        with pytest.raises(ConnectionError):
            await _run(client, [["PING"]], TIMEOUT_S)
        assert time.monotonic() - started <= TIMEOUT_S + SLACK_S
        server.start()
        assert await _run(client, [["PING"]]) == ["PONG"]
    finally:
        client.close()


async def test_a_redis_restarted_while_idle_is_reported_once(server: RedisServer) -> None:
    """Redis restarts while no call is pending: the next call raises ConnectionError (the
    store must learn its state is gone, as redis-py without retries told it), and the
    one after connects to the new Redis."""
    client = RespClient(server.url, connect_timeout_s=TIMEOUT_S)
    try:
        assert await _run(client, [["SET", "k", "v"]]) == ["OK"]
        server.kill()
        server.start()
        await asyncio.sleep(0.05)  # the loss reaches the idle connection
        with pytest.raises(ConnectionError):
            await _run(client, [["GET", "k"]])
        assert await _run(client, [["GET", "k"]]) == [None]
    finally:
        client.close()


async def test_a_paused_redis_times_out_every_pending_call(server: RedisServer) -> None:
    """SIGSTOP: every pending pipeline fails with TimeoutError at the deadline, the
    connection is dropped, and calls work again once Redis resumes."""
    client = RespClient(server.url, connect_timeout_s=TIMEOUT_S)
    try:
        assert await _run(client, [["PING"]]) == ["PONG"]
        server.pause()
        try:
            started = time.monotonic()
            first = asyncio.ensure_future(_run(client, [["PING"]], TIMEOUT_S))
            second = asyncio.ensure_future(_run(client, [["PING"]], 10.0))
            for call in (first, second):
                with pytest.raises(TimeoutError):
                    await call
            assert time.monotonic() - started <= TIMEOUT_S + SLACK_S
            started = time.monotonic()
            with pytest.raises(TimeoutError):  # a new connection: accepted, never answered
                await _run(client, [["PING"]], TIMEOUT_S)
            assert time.monotonic() - started <= TIMEOUT_S + SLACK_S
        finally:
            server.resume()
        assert await _run(client, [["PING"]]) == ["PONG"]
    finally:
        client.close()


async def test_a_cancelled_call_leaves_the_connection_in_step(redis_url: str) -> None:
    """A caller that gives up before its replies come does not shift anyone else's."""
    client = RespClient(redis_url, connect_timeout_s=1.0)
    try:
        slow = asyncio.ensure_future(_run(client, [["BLPOP", "q", 0.2]]))
        after = asyncio.ensure_future(_run(client, [["ECHO", "mine"]]))
        await asyncio.sleep(0.05)
        slow.cancel()
        assert await after == ["mine"]
        assert await _run(client, [["ECHO", "next"]]) == ["next"]
    finally:
        client.close()


async def test_close_fails_pending_calls(redis_url: str) -> None:
    """``close`` fails what is in flight with ConnectionError; the client opens again later."""
    client = RespClient(redis_url, connect_timeout_s=1.0)
    pending = asyncio.ensure_future(_run(client, [["BLPOP", "q", 1]]))
    await asyncio.sleep(0.05)
    client.close()
    with pytest.raises(ConnectionError):
        await pending
    assert await _run(client, [["PING"]]) == ["PONG"]
    client.close()
