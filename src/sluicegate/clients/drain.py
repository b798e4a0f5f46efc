"""``sluicegate drain``: stop a running gateway admitting, then wait until it is idle.

Meant for a Kubernetes ``preStop`` hook: ``POST /admin/drain`` makes ``/readyz``
answer 503 (the pod leaves the Service's endpoints) and refuses new requests with
503 ``draining`` and ``Retry-After``, while queued and running requests finish;
the command returns once nothing is queued or running, or after ``wait_s``, and
the container's SIGTERM follows. ``sluicegate drain --cancel`` undoes a drain
(``POST /admin/undrain``): ``/readyz`` is 200 again and new requests are admitted.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from sluicegate.errors import SluicegateError

__all__ = ["DrainError", "DrainResult", "busy_counts", "drain", "undrain"]


class DrainError(SluicegateError):
    """The gateway could not be drained: unreachable, or the admin key was refused."""


@dataclass(frozen=True)
class DrainResult:
    """How a drain ended: ``idle`` once nothing was queued or running, after ``waited_s``."""

    idle: bool
    waited_s: float
    queued: int
    running: int


def busy_counts(state: object) -> tuple[int, int, int]:
    """Queued and running requests in an ``/admin/state`` answer (summed over workers),
    and the workers that did not answer (``serve --workers``): those may still be busy."""
    if not isinstance(state, dict):
        raise DrainError("/admin/state did not answer an object")
    parts = state.get("workers", [state])
    queued = running = silent = 0
    for part in parts:
        if "error" in part:
            silent += 1
        for model in part.get("models", ()):
            queued += int(model.get("queued", 0))
            running += int(model.get("running", 0))
    return queued, running, silent


def _call(url: str, method: str, key: str, timeout_s: float) -> object:
    request = urllib.request.Request(
        url,
        method=method,
        # The admin actions refuse a body that is not JSON: an empty one, typed JSON.
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        data=b"" if method == "POST" else None,
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return orjson.loads(reply.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise DrainError("the gateway refused the admin key (HTTP 401)") from None
        raise DrainError(f"{method} {url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DrainError(f"cannot reach the gateway at {url}: {reason}") from None


def drain(
    base_url: str,
    admin_key: str,
    *,
    wait_s: float,
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> DrainResult:
    """Drain the gateway at ``base_url`` and wait up to ``wait_s`` for it to go idle."""
    base = base_url.rstrip("/")
    _call(f"{base}/admin/drain", "POST", admin_key, timeout_s=5.0)
    started = clock()
    while True:
        queued, running, silent = busy_counts(_call(f"{base}/admin/state", "GET", admin_key, 5.0))
        waited = clock() - started
        if queued == 0 and running == 0 and silent == 0:
            return DrainResult(True, waited, 0, 0)
        if waited >= wait_s:
            return DrainResult(False, waited, queued, running)
        sleep(min(poll_s, max(0.0, wait_s - waited)))


def undrain(base_url: str, admin_key: str) -> bool:
    """Undo a drain of the gateway at ``base_url``: whether every worker admits again
    (false when a worker of ``serve --workers`` did not answer)."""
    answer = _call(f"{base_url.rstrip('/')}/admin/undrain", "POST", admin_key, timeout_s=5.0)
    if not isinstance(answer, dict):
        raise DrainError("/admin/undrain did not answer an object")
    return answer.get("draining") is False
