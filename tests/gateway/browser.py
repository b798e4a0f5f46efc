"""A small driver for headless Debian Chromium over the DevTools protocol, for page tests.

Chromium runs as a real process with a throw-away profile; the driver talks to it
over one websocket (aiohttp) with flattened target sessions. Only what the dashboard
tests need: open a page, set request headers, answer HTTP auth challenges, evaluate
JavaScript, collect console errors and CSP violations, take a screenshot.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-port=0",
)
Handler = Callable[[dict[str, Any]], None]


class BrowserError(RuntimeError):
    """Chromium is missing, did not start, or answered a command with an error."""


def chromium_path() -> str:
    """The Chromium executable; ``BrowserError`` naming the package when there is none."""
    found = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    if found is None:
        raise BrowserError(
            f"{CHROMIUM} is missing: the dashboard's browser tests need Debian's Chromium "
            "(apt-get install chromium)"
        )
    return found


class Connection:
    """One DevTools websocket: commands matched to answers by id, events to handlers."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self._socket = socket
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._handlers: dict[tuple[str | None, str], list[Handler]] = {}
        self._later: set[asyncio.Task[dict[str, Any]]] = set()
        self._reader = asyncio.create_task(self._read())

    async def call(
        self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None
    ) -> dict[str, Any]:
        """Send one command and return its result (``BrowserError`` on a protocol error)."""
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        answer = asyncio.get_running_loop().create_future()
        self._pending[ident] = answer
        await self._socket.send_json(message)
        reply = await asyncio.wait_for(answer, 30)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    def call_soon(self, method: str, params: dict[str, Any], *, session: str | None = None) -> None:
        """Send a command from an event handler (which cannot wait for the answer)."""
        task = asyncio.create_task(self.call(method, params, session=session))
        self._later.add(task)
        task.add_done_callback(self._later.discard)

    def on(self, method: str, handler: Handler, *, session: str | None = None) -> None:
        """Call ``handler(params)`` for every event ``method`` (of ``session``)."""
        self._handlers.setdefault((session, method), []).append(handler)

    async def _read(self) -> None:
        async for frame in self._socket:
            if frame.type != aiohttp.WSMsgType.TEXT:
                continue
            message = frame.json()
            if "id" in message:
                future = self._pending.pop(message["id"], None)
                if future is not None and not future.done():
                    future.set_result(message)
                continue
            key = (message.get("sessionId"), message.get("method", ""))
            for handler in self._handlers.get(key, []):
                handler(message.get("params", {}))
        for future in self._pending.values():
            if not future.done():
                future.set_exception(BrowserError("the browser closed its DevTools socket"))

    async def close(self) -> None:
        """Stop reading and close the socket."""
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self._socket.close()


class Page:
    """One tab: navigation, evaluation, headers, auth answers and the errors it logged."""

    def __init__(self, connection: Connection, session: str) -> None:
        self.connection = connection
        self.session = session
        self.errors: list[str] = []
        self._loaded = asyncio.Event()
        connection.on("Page.loadEventFired", lambda _: self._loaded.set(), session=session)
        connection.on("Runtime.exceptionThrown", self._exception, session=session)
        connection.on("Log.entryAdded", self._log, session=session)

    def _exception(self, params: dict[str, Any]) -> None:
        details = params.get("exceptionDetails", {})
        text = details.get("exception", {}).get("description") or details.get("text", "")
        self.errors.append(f"exception: {text}")

    def _log(self, params: dict[str, Any]) -> None:
        entry = params.get("entry", {})
        if entry.get("level") == "error":
            self.errors.append(f"{entry.get('source')}: {entry.get('text')} ({entry.get('url')})")

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """A DevTools command in this tab's session."""
        return await self.connection.call(method, params, session=self.session)

    def call_soon(self, method: str, **params: Any) -> None:
        """A DevTools command in this tab's session, sent from an event handler."""
        self.connection.call_soon(method, params, session=self.session)

    async def navigate(self, url: str, *, within_s: float = 15.0) -> None:
        """Load ``url`` and wait for its load event."""
        self._loaded.clear()
        result = await self.call("Page.navigate", url=url)
        if result.get("errorText"):
            raise BrowserError(f"navigating to {url}: {result['errorText']}")
        await asyncio.wait_for(self._loaded.wait(), within_s)

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` evaluated in the page (promises awaited)."""
        result = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, *, within_s: float = 10.0) -> Any:
        """Evaluate ``expression`` every 50 ms until it is truthy; return that value."""
        deadline = time.monotonic() + within_s
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"still falsy after {within_s} s: {expression}")
            await asyncio.sleep(0.05)

    async def set_headers(self, headers: dict[str, str]) -> None:
        """Send ``headers`` with every request this tab makes from now on."""
        await self.call("Network.setExtraHTTPHeaders", headers=headers)

    async def answer_auth(self, username: str, password: str) -> list[str]:
        """Answer every HTTP auth challenge with ``username``/``password`` (as a person
        typing them into the browser's prompt would); returns the list of challenged URLs,
        filled as challenges come."""
        challenged: list[str] = []

        def paused(params: dict[str, Any]) -> None:
            self.call_soon("Fetch.continueRequest", requestId=params["requestId"])

        def auth(params: dict[str, Any]) -> None:
            challenged.append(params["request"]["url"])
            response = {
                "response": "ProvideCredentials", "username": username, "password": password,
            }  # fmt: skip
            self.call_soon(
                "Fetch.continueWithAuth",
                requestId=params["requestId"],
                authChallengeResponse=response,
            )

        self.connection.on("Fetch.requestPaused", paused, session=self.session)
        self.connection.on("Fetch.authRequired", auth, session=self.session)
        await self.call("Fetch.enable", handleAuthRequests=True, patterns=[{"urlPattern": "*"}])
        return challenged

    async def fulfill(self, url_pattern: str, body: bytes) -> None:
        """From now on answer this tab's requests matching ``url_pattern`` with 200 and the
        JSON ``body`` (through the browser's request interception) instead of sending them."""
        encoded = base64.b64encode(body).decode()
        headers = [{"name": "Content-Type", "value": "application/json"}]

        def paused(params: dict[str, Any]) -> None:
            self.call_soon(
                "Fetch.fulfillRequest",
                requestId=params["requestId"],
                responseCode=200,
                responseHeaders=headers,
                body=encoded,
            )

        self.connection.on("Fetch.requestPaused", paused, session=self.session)
        await self.call("Fetch.enable", patterns=[{"urlPattern": url_pattern}])

    async def screenshot(self, path: Path, *, height: int | None = None) -> None:
        """Save a PNG of the viewport to ``path`` (only its top ``height`` pixels, if given)."""
        clip: dict[str, Any] = {}
        if height is not None:
            width = await self.evaluate("document.documentElement.clientWidth")
            clip = {"clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}}
        result = await self.call("Page.captureScreenshot", format="png", **clip)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(result["data"]))


class Browser:
    """A running headless Chromium and its DevTools connection."""

    def __init__(self, process: subprocess.Popen[bytes], connection: Connection) -> None:
        self.process = process
        self.connection = connection

    async def new_page(self, width: int = 1400, height: int = 1000) -> Page:
        """A fresh tab of ``width`` × ``height`` CSS pixels, with its events enabled."""
        target = await self.connection.call("Target.createTarget", {"url": "about:blank"})
        attached = await self.connection.call(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        page = Page(self.connection, attached["sessionId"])
        for domain in ("Page", "Runtime", "Log", "Network"):
            await page.call(f"{domain}.enable")
        await page.call(
            "Emulation.setDeviceMetricsOverride",
            width=width, height=height, deviceScaleFactor=1, mobile=False,
        )  # fmt: skip
        return page


async def _devtools_url(profile: Path, process: subprocess.Popen[bytes], log: Path) -> str:
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 30
    while not marker.exists() or len(marker.read_text().splitlines()) < 2:
        if process.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:]
            raise BrowserError(f"Chromium did not start (exit {process.poll()}):\n{tail}")
        await asyncio.sleep(0.05)
    port, path = marker.read_text().splitlines()[:2]
    return f"ws://127.0.0.1:{port}{path}"


@contextlib.asynccontextmanager
async def chromium(workdir: Path) -> AsyncIterator[Browser]:
    """Headless Chromium with a profile under ``workdir``; stopped (its whole process
    group) on exit."""
    profile = workdir / "chromium-profile"
    profile.mkdir(parents=True, exist_ok=True)
    (profile / "DevToolsActivePort").unlink(missing_ok=True)  # a previous run's port
    log = workdir / "chromium.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [chromium_path(), *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, start_new_session=True,
        )  # fmt: skip
    try:
        url = await _devtools_url(profile, process, log)
        async with aiohttp.ClientSession() as session:
            socket = await session.ws_connect(url, max_msg_size=64 * 1024 * 1024)
            connection = Connection(socket)
            try:
                yield Browser(process, connection)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(connection.call("Browser.close"), 5)
                await connection.close()
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
