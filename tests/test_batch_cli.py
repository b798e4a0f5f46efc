"""``sluicegate batch``: the real console command, run as a subprocess, against a real gateway
with the batch lane on, in front of an emulated engine on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.clients.batch_command import parse_metadata
from sluicegate.clients.batch_http import BatchCliError, base_url
from sluicegate.gateway.app import build_app as build_gateway
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    MODEL,
    Stack,
    engine_server,
    gateway_config,
    http_call,
    stack,
    start_server,
    stop_servers,
    unused_port,
)

KEY = "sk-cli-tenant-canary-7f3a"
WRONG_KEY = "sk-wrong-canary-91c2"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
COMMAND_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One gateway (tenant ``a`` with ``KEY``, batch lane on, two lines at a time) and engine."""
    db = tmp_path_factory.mktemp("batches") / "batches.db"
    with stack(batches_body(db), environ={"KEY_A": KEY}) as running:
        yield running


def batches_body(db: Path, settings: str = "") -> str:
    """Tenant ``a`` (key in ``KEY_A``) and the batch lane on, its database at ``db``."""
    return (
        "tenants:\n  - {name: a, api_key_env: KEY_A}\n"
        f"batches:\n  path: {db}\n  poll_interval_s: 0.1\n  max_inflight: 2\n{settings}"
    )


def cli(
    args: Sequence[str], *, key: str | None = KEY, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m sluicegate batch ARGS`` with ``OPENAI_API_KEY`` set to ``key``
    (unset when None)."""
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    if key is not None:
        env["OPENAI_API_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "sluicegate", "batch", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )


def write_lines(path: Path, lines: Sequence[dict[str, Any]]) -> Path:
    """``lines`` as a JSONL file at ``path``."""
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return path


def chat_line(custom_id: str, model: str = MODEL) -> dict[str, Any]:
    """A short chat completion line."""
    body = {"model": model, "messages": [{"role": "user", "content": custom_id}], "max_tokens": 8}
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def long_line(custom_id: str) -> dict[str, Any]:
    """A completion line that generates 5000 tokens (it runs for many seconds)."""
    body = {"model": MODEL, "prompt": "hold", "max_tokens": 5000, "ignore_eos": True}
    return {"custom_id": custom_id, "method": "POST", "url": COMPLETIONS, "body": body}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSONL file, parsed."""
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def batch_status_at(url: str, batch_id: str) -> str:
    """The batch's status, straight from the API of the gateway at ``url``."""
    reply = http_call(url, "GET", f"/v1/batches/{batch_id}", key=KEY)
    assert reply.status == 200, reply
    status: str = reply.json()["status"]
    return status


def batch_status(live: Stack, batch_id: str) -> str:
    """The batch's status, straight from the API."""
    return batch_status_at(live.base_url, batch_id)


def only_id(stdout: str) -> str:
    """The batch id that ``submit`` prints alone on stdout."""
    lines = stdout.splitlines()
    assert len(lines) == 1, stdout
    assert lines[0].startswith("batch_"), stdout
    return lines[0]


def test_submit_watch_downloads_one_line_per_custom_id(live: Stack, tmp_path: Path) -> None:
    """submit --watch uploads, creates, watches the bar to the total and downloads both files:
    each custom_id in exactly one line, answers in the output file, the line naming an
    unknown model in the error file; exit 0 for a completed batch."""
    ids = [f"r{i}" for i in range(30)]
    lines = [chat_line(i) for i in ids] + [chat_line("bad", model="no-such-model")]
    source = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "results"
    result = cli(
        ["submit", str(source), "--url", live.base_url, "--watch", "--output", str(out),
         "--interval", "0.2", "--metadata", "run=cli-test"],
    )  # fmt: skip
    assert result.returncode == 0, result
    batch_id = result.stdout.splitlines()[0]
    assert batch_id.startswith("batch_"), result.stdout
    assert f"batch {batch_id} completed: 30 completed, 1 failed of 31" in result.stdout
    assert "31/31" in result.stderr.splitlines()[-1], result.stderr
    output = read_jsonl(out / f"{batch_id}_output.jsonl")
    errors = read_jsonl(out / f"{batch_id}_errors.jsonl")
    assert sorted(line["custom_id"] for line in output) == sorted(ids)
    assert [line["custom_id"] for line in errors] == ["bad"]
    assert all(line["response"]["status_code"] == 200 for line in output)
    assert errors[0]["error"]["code"] == "model_not_found"
    assert f"output: {out / f'{batch_id}_output.jsonl'} (30 lines)" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        f"{batch_id}_errors.jsonl",
        f"{batch_id}_output.jsonl",
    ]
    reply = http_call(live.base_url, "GET", f"/v1/batches/{batch_id}", key=KEY)
    assert reply.json()["metadata"] == {"run": "cli-test"}


def test_download_writes_only_the_files_a_batch_has(live: Stack, tmp_path: Path) -> None:
    """download of a batch whose every line succeeded writes <id>_output.jsonl alone, with the
    same lines the API serves, and prints its count; the default directory is the cwd."""
    source = write_lines(tmp_path / "in.jsonl", [chat_line(f"d{i}") for i in range(5)])
    submitted = cli(["submit", str(source), "--url", live.base_url, "--watch", "--interval", "0.2"],
                    cwd=tmp_path)  # fmt: skip
    assert submitted.returncode == 0, submitted
    batch_id = submitted.stdout.splitlines()[0]
    fetched = tmp_path / "fetched"
    fetched.mkdir()
    result = cli(["download", batch_id, "--url", live.base_url], cwd=fetched)
    assert result.returncode == 0, result
    assert result.stdout.strip() == f"output: {batch_id}_output.jsonl (5 lines)"
    assert [p.name for p in fetched.iterdir()] == [f"{batch_id}_output.jsonl"]
    written = (fetched / f"{batch_id}_output.jsonl").read_bytes()
    assert written == (tmp_path / f"{batch_id}_output.jsonl").read_bytes()
    file_id = http_call(live.base_url, "GET", f"/v1/batches/{batch_id}", key=KEY).json()[
        "output_file_id"
    ]
    served = http_call(live.base_url, "GET", f"/v1/files/{file_id}/content", key=KEY)
    assert written == served.body
    assert sorted(line["custom_id"] for line in read_jsonl(fetched / f"{batch_id}_output.jsonl")) \
        == [f"d{i}" for i in range(5)]  # fmt: skip


def test_watch_exits_1_when_the_batch_is_cancelled(live: Stack, tmp_path: Path) -> None:
    """A running batch: download refuses it (exit 2, not ended yet); watch, polling it before the
    cancel, exits 1 and says cancelled; download then writes one line per custom_id, the
    unfinished ones batch_cancelled errors."""
    ids = [f"c{i}" for i in range(12)]
    source = write_lines(tmp_path / "slow.jsonl", [long_line(i) for i in ids])
    submitted = cli(["submit", str(source), "--url", live.base_url])
    assert submitted.returncode == 0, submitted
    batch_id = only_id(submitted.stdout)
    deadline = time.monotonic() + 60
    while batch_status(live, batch_id) == "validating" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert batch_status(live, batch_id) == "in_progress"
    early = cli(["download", batch_id, "--url", live.base_url, "--output", str(tmp_path)])
    assert early.returncode == 2, early
    assert f"batch {batch_id} is in_progress" in early.stderr
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env["SOME_KEY"] = KEY
    watcher = subprocess.Popen(
        [sys.executable, "-m", "sluicegate", "batch", "watch", batch_id, "--url", live.base_url,
         "--interval", "0.2", "--api-key-env", "SOME_KEY"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert watcher.stderr is not None
        assert watcher.stderr.readline().startswith(f"watching {batch_id}")
        cancelled = cli(["cancel", batch_id, "--url", live.base_url])
        assert cancelled.returncode == 0, cancelled
        assert cancelled.stdout.strip() in (f"batch {batch_id}: cancelling",
                                            f"batch {batch_id}: cancelled")  # fmt: skip
        stdout, stderr = watcher.communicate(timeout=COMMAND_TIMEOUT_S)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    assert watcher.returncode == 1, (stdout, stderr)
    assert f"batch {batch_id} cancelled:" in stderr
    assert "of 12" in stderr
    fetched = cli(["download", batch_id, "--url", live.base_url, "--output", str(tmp_path)])
    assert fetched.returncode == 0, fetched
    errors = read_jsonl(tmp_path / f"{batch_id}_errors.jsonl")
    output_path = tmp_path / f"{batch_id}_output.jsonl"
    output = read_jsonl(output_path) if output_path.exists() else []
    assert sorted(line["custom_id"] for line in output + errors) == sorted(ids)
    assert any(line["error"] and line["error"]["code"] == "batch_cancelled" for line in errors)


def test_watch_rides_out_a_gateway_restart(tmp_path: Path) -> None:
    """The gateway stops mid-watch and a new one starts on the same port and database: watch
    keeps polling through the outage and exits 0 once the batch completes there."""
    ids = [f"g{i}" for i in range(6)]
    lines = [{**long_line(i), "body": {**long_line(i)["body"], "max_tokens": 300}} for i in ids]
    source = write_lines(tmp_path / "in.jsonl", lines)
    body = batches_body(tmp_path / "batches.db", "  lease_s: 1.0\n")
    env = {"SLUICEGATE_ADMIN_KEY": ADMIN_KEY, "KEY_A": KEY}
    with engine_server() as engine:
        config = gateway_config([engine.port], body)
        first = start_server(build_gateway(config, environ=env))
        url = f"http://127.0.0.1:{first.port}"
        servers = [first]
        watcher: subprocess.Popen[str] | None = None
        try:
            batch_id = only_id(cli(["submit", str(source), "--url", url]).stdout)
            watcher = subprocess.Popen(
                [sys.executable, "-m", "sluicegate", "batch", "watch", batch_id, "--url", url,
                 "--interval", "0.2"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env={**os.environ, "OPENAI_API_KEY": KEY},
            )  # fmt: skip
            assert watcher.stderr is not None
            assert watcher.stderr.readline().startswith(f"watching {batch_id}")
            stop_servers(servers)
            servers = []
            time.sleep(1.5)
            assert watcher.poll() is None, watcher.communicate()
            servers = [start_server(build_gateway(config, environ=env), first.port)]
            stdout, stderr = watcher.communicate(timeout=COMMAND_TIMEOUT_S)
        finally:
            if watcher is not None and watcher.poll() is None:
                watcher.kill()
                watcher.communicate()
            stop_servers(servers)
    assert watcher.returncode == 0, (stdout, stderr)
    assert f"batch {batch_id} completed: 6 completed, 0 failed of 6" in stdout
    assert "6/6" in stderr.splitlines()[-1], stderr


def test_list_shows_the_tenants_batches(live: Stack, tmp_path: Path) -> None:
    """list --limit 2 prints the two newest of three batches just made, newest first, with their
    endpoint, and says there are more."""
    source = write_lines(tmp_path / "in.jsonl", [chat_line("l0")])
    made = [only_id(cli(["submit", str(source), "--url", live.base_url]).stdout) for _ in "abc"]
    result = cli(["list", "--url", live.base_url, "--limit", "2"])
    assert result.returncode == 0, result
    rows = [line for line in result.stdout.splitlines() if "batch_" in line]
    assert len(rows) == 2, result.stdout
    assert made[2] in rows[0], result.stdout
    assert made[1] in rows[1], result.stdout
    assert CHAT in rows[0]
    assert "more: raise --limit" in result.stdout


@pytest.mark.parametrize("command", ["submit", "list"])
@pytest.mark.parametrize("key", [WRONG_KEY, None], ids=["wrong-key", "no-key"])
def test_a_refused_key_exits_2_with_the_401_and_never_shows_it(
    live: Stack, tmp_path: Path, command: str, key: str | None
) -> None:
    """A key the gateway refuses: exit 2 with the gateway's 401 message and code, and neither
    the key presented nor the real one anywhere in the output; with no key, a hint names the
    unset variable."""
    source = write_lines(tmp_path / "in.jsonl", [chat_line("k0")])
    args = ["submit", str(source)] if command == "submit" else ["list"]
    result = cli([*args, "--url", live.base_url], key=key)
    assert result.returncode == 2, result
    assert "error: missing or unknown API key (invalid_api_key, HTTP 401)" in result.stderr
    assert result.stdout == ""
    for secret in (WRONG_KEY, KEY):
        assert secret not in result.stderr + result.stdout
    assert ("OPENAI_API_KEY that holds the API key is not set" in result.stderr) == (key is None)


def test_a_missing_file_is_a_clear_error(live: Stack, tmp_path: Path) -> None:
    """submit of a file that does not exist exits 2 naming it, before any request."""
    missing = tmp_path / "nope.jsonl"
    result = cli(["submit", str(missing), "--url", live.base_url])
    assert result.returncode == 2, result
    assert result.stderr.strip() == f"error: {missing}: no such file"
    reply = http_call(live.base_url, "GET", "/v1/files", key=KEY)
    assert all(f["filename"] != "nope.jsonl" for f in reply.json()["data"])


def test_an_unreachable_gateway_is_exit_2(tmp_path: Path) -> None:
    """Nothing listening at --url: exit 2 saying the gateway cannot be reached."""
    url = f"http://127.0.0.1:{unused_port()}"
    result = cli(["watch", "batch_x", "--url", url])
    assert result.returncode == 2, result
    assert result.stderr.startswith(f"error: cannot reach the gateway at {url}")


def test_an_unknown_batch_is_the_gateways_404(live: Stack) -> None:
    """watch of an id the tenant does not have prints the gateway's not_found, exit 2."""
    result = cli(["watch", "batch_unknown", "--url", live.base_url + "/v1/"])
    assert result.returncode == 2, result
    assert result.stderr.strip() == "error: no such batch: 'batch_unknown' (not_found, HTTP 404)"


@pytest.mark.parametrize(
    "args",
    [
        ["--metadata", "novalue"],
        ["--output", "dir"],
        ["--url", "ftp://host"],
    ],
    ids=["metadata", "output-without-watch", "url-scheme"],
)
def test_usage_errors_exit_2(tmp_path: Path, args: list[str]) -> None:
    """Bad arguments exit 2 with a message naming the option, without contacting anything."""
    source = write_lines(tmp_path / "in.jsonl", [chat_line("u0")])
    url = [] if "--url" in args else ["--url", f"http://127.0.0.1:{unused_port()}"]
    result = cli(["submit", str(source), *url, *args])
    assert result.returncode == 2, result
    assert result.stderr.startswith("error: "), result.stderr
    assert args[0] in result.stderr


@given(st.dictionaries(st.text(min_size=1).filter(lambda k: "=" not in k), st.text()))
def test_metadata_pairs_round_trip(metadata: dict[str, str]) -> None:
    """Every KEY=VALUE list (values may hold '=') parses back to the mapping it came from."""
    assert parse_metadata([f"{k}={v}" for k, v in metadata.items()]) == metadata


@given(
    st.sampled_from(["http", "https"]),
    st.from_regex(r"[a-z0-9.-]{1,20}(:[0-9]{1,5})?", fullmatch=True),
    st.sampled_from(["", "/", "/v1", "/v1/"]),
)
def test_base_url_drops_a_v1_suffix(scheme: str, host: str, suffix: str) -> None:
    """A URL with or without a trailing / or /v1 names the same gateway root."""
    assert base_url(f"{scheme}://{host}{suffix}") == f"{scheme}://{host}"


def test_base_url_refuses_other_schemes() -> None:
    """Only http(s) URLs with a host are accepted."""
    for bad in ("ftp://h", "http://", "127.0.0.1:8080"):
        with pytest.raises(BatchCliError):
            base_url(bad)
