"""What sluicegate knows of one engine's wire: the base every engine profile fills in.

A profile is sans-I/O: the gateway's poller fetches the paths a profile names and
hands it the answers; the relay hands it an engine's error body. Each engine's profile
is one small module in this package, written from that engine's own documentation and
source (named in its docstring), and registered by name in ``__init__.py``; every one
passes the conformance suite in ``tests/engines/`` against recorded-format fixtures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from sluicegate.engine_profiles.prometheus_text import Samples


@dataclass(frozen=True, slots=True)
class Reading:
    """What one scrape (or info answer) says about an engine; None: not reported.

    ``kv_usage`` is the fraction of KV-cache capacity in use (0–1),
    ``kv_capacity_tokens`` the KV cache's size in tokens (what ``max_inflight_tokens:
    auto`` is derived from), ``prefix_hit_rate`` the fraction of prompt tokens (or
    requests, where that is all an engine reports) served from its prefix cache.
    """

    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    kv_capacity_tokens: int | None = None
    prefix_hit_rate: float | None = None

    def merged(self, other: Reading) -> Reading:
        """This reading with ``other``'s values where this one has none."""
        return Reading(
            running=_either(self.running, other.running),
            waiting=_either(self.waiting, other.waiting),
            kv_usage=_either(self.kv_usage, other.kv_usage),
            kv_capacity_tokens=_either(self.kv_capacity_tokens, other.kv_capacity_tokens),
            prefix_hit_rate=_either(self.prefix_hit_rate, other.prefix_hit_rate),
        )


_T = TypeVar("_T")


def _either(first: _T | None, second: _T | None) -> _T | None:
    return first if first is not None else second


@dataclass(frozen=True, slots=True)
class EngineError:
    """An engine's error body, read: its message and its own kind of error, if it says."""

    message: str | None
    kind: str | None = None


class EngineProfile:
    """One engine's endpoints, metric names, error shape and quirks.

    Subclasses set the class attributes and override the readers their engine needs.
    The defaults describe an engine with vLLM's endpoints and OpenAI's error shape.
    """

    name: str = ""
    """The ``engine:`` value that selects this profile."""
    summary: str = ""
    """One line for the docs: what the gateway reads from this engine."""
    health_path: str | None = "/health"
    """Liveness; None if the engine has none (any HTTP answer then means up)."""
    metrics_path: str | None = "/metrics"
    """Prometheus text; None if the engine exports none."""
    info_path: str | None = None
    """A JSON document read once (and after each restart) for limits such as capacity."""
    metric_names: frozenset[str] = frozenset()
    """Every sample name ``read_metrics`` looks at (the scan keeps only these)."""
    streams_unary: bool = False
    """Send non-streamed requests as streams: the engine notices a departed client of a
    non-streamed request late or never, so only a stream's end stops it."""
    keeps_alive: bool = True
    """Whether upstream connections to it may be pooled."""
    priority_field: str | None = None
    """The request field its priority scheduler reads; None if it has none."""

    def read_metrics(self, samples: Samples) -> Reading:
        """What a scrape of ``metrics_path`` says (the samples of ``metric_names``)."""
        return Reading()

    def read_info(self, info: dict[str, object]) -> Reading:
        """What the ``info_path`` document says (capacity, limits)."""
        return Reading()

    def healthy(self, status: int) -> bool:
        """Whether a ``health_path`` answer of ``status`` means the engine serves."""
        return status < 500

    def read_error(self, answer: dict[str, object]) -> EngineError:
        """The message and kind of an error body (OpenAI's shape, or vLLM's older one with
        the message at the top level)."""
        error = answer.get("error")
        if isinstance(error, dict):
            return EngineError(_text(error.get("message")), _text(error.get("type")))
        return EngineError(_text(answer.get("message")), _text(answer.get("type")))

    def error_code(self, status: int, error: EngineError) -> str | None:
        """The OpenAI ``code`` for an error the engine names itself; None: by status."""
        return None

    def client_fault(self, status: int, error: EngineError) -> bool:
        """Whether an engine 500 is in truth the request's own fault (answered 400)."""
        return False

    def engine_fault(self, status: int, error: EngineError) -> bool:
        """Whether an engine 4xx is in truth the engine's own failure (answered 502)."""
        return False

    def busy(self, status: int, body: bytes) -> bool:
        """Whether an answer says the engine is full in a shape of its own (relayed as an
        engine 429: a drop for the adaptive limit, nothing against the circuit)."""
        return False

    def priority_value(self, priority: int) -> int:
        """The value of ``priority_field`` for a sluicegate priority (lower runs first)."""
        return priority


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
