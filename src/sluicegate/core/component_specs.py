"""Validated settings of the parts plugins are built from: a backend and an adaptive limit.

Routers read ``BackendSpec`` (through ``BackendState``) and limits read
``AdaptiveSpec``, so both live here, below the plugin registries.
``core/spec.py`` sits above the registries: it checks the plugin names a
config gives (a lane's policy, a model's router and adaptive ``mode``) against
them, and re-exports these classes, so ``sluicegate.core.spec`` stays the one
place callers import configuration from.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class FrozenSpec(BaseModel):
    """Base of every spec: immutable, and an unknown field is an error naming it."""

    model_config = ConfigDict(frozen=True, extra="forbid")


EngineKind = Literal[
    "vllm", "sglang", "tgi", "trtllm", "llama-server", "llamacpp", "ray-serve", "emulator"
]
"""The engines that have a profile (``sluicegate.engine_profiles.PROFILES``, the same set:
``tests/engines`` holds them equal)."""


class KvEventsSpec(FrozenSpec):
    """Where a backend's engine publishes its KV cache events (vLLM's
    ``--kv-events-config``: a ZMQ PUB ``endpoint``, a ROUTER ``replay_endpoint``, a
    ``topic``), and how much of them the gateway remembers."""

    endpoint: str = Field(pattern=r"^tcp://[^\s]+:\d+$")
    replay_endpoint: str | None = Field(None, pattern=r"^tcp://[^\s]+:\d+$")
    topic: str = Field("", max_length=256)
    max_blocks: int = Field(1_000_000, ge=1, le=100_000_000)


class PrefixRoutingSpec(FrozenSpec):
    """How a model's prompts are cut into KV blocks for precise prefix routing, and when
    the ``precise_prefix`` router stops following a prefix (``core/prefix_blocks.py``).

    ``block_tokens`` must be the engines' block size and ``chars_per_token`` the same
    rule the engines' events were hashed with. ``recent_ttl_s``: how long the router
    remembers where it sent a prompt's blocks before the engine announces them.
    ``max_ttft_penalty_ms``: follow a prefix while the chosen backend's queued prefill
    would cost at most this much time to first token (sticky until saturated; None:
    always follow it). ``prefill_tokens_per_s``: the engines' prefill rate the penalty
    is computed with (None: learned from the answers' time to first token).
    """

    block_tokens: int = Field(16, ge=1, le=4096)
    chars_per_token: int = Field(4, ge=1, le=64)
    recent_ttl_s: float = Field(2.0, ge=0.0, le=600.0)
    max_ttft_penalty_ms: float | None = Field(500.0, gt=0.0, le=600_000.0)
    prefill_tokens_per_s: float | None = Field(None, gt=0.0)


class BackendSpec(FrozenSpec):
    """One engine replica serving a model.

    ``engine`` names its profile (``sluicegate.engine_profiles``): the metrics, endpoints,
    error shapes and quirks the gateway expects of it (``llamacpp`` is llama-cpp-python's
    server, ``llama-server`` llama.cpp's own). ``metrics_url``: where its Prometheus
    text is when not at the profile's path on ``url`` (Triton and Ray Serve export on a
    port of their own). ``priority_passthrough``: add the engine's priority field to
    each request from its sluicegate priority, for an engine started with its priority
    scheduler (``config.py`` refuses it for an engine that has none). ``kv_events``:
    subscribe to the engine's KV cache events, for the ``precise_prefix`` router.
    """

    name: str = Field(min_length=1)
    url: str | None = None
    weight: float = Field(1.0, gt=0.0, le=1000.0)
    max_concurrency: int | None = Field(None, ge=1)
    engine: EngineKind = "vllm"
    metrics_url: str | None = Field(None, pattern=r"^https?://")
    priority_passthrough: bool = False
    kv_events: KvEventsSpec | None = None


class AdaptiveSpec(FrozenSpec):
    """Adaptive concurrency limit for a model (DESIGN §5).

    ``kv_cache``: multiply by ``decrease`` above ``high_water`` KV usage, add
    ``increase`` below ``low_water``. ``latency``: Gradient2 on latency samples
    (time to first token, or a unary answer's time per output token), and
    ``1 - smoothing / 2`` per drop. ``aimd``: multiply by ``decrease`` (at least
    one less) per drop or first token slower than ``timeout_s``, add
    ``increase`` per other answer while at least half the limit is in use.
    ``slo``: every ``window`` answers, multiply by ``decrease`` when the
    ``quantile`` of their time per output token exceeds ``tpot_ms`` or of their
    time to first token (from admission) exceeds ``ttft_ms``, else add
    ``increase`` while at least half the limit was in use.
    What counts as a drop or a sample: ``sluicegate.core.limits.feedback``.

    ``mode`` must name a registered limit (``core/limits``); ``ModelSpec``
    checks it, since the limits themselves are built from this class.
    """

    mode: str = "kv_cache"
    floor: int = Field(1, ge=1)
    high_water: float = Field(0.88, gt=0.0, le=1.0)
    low_water: float = Field(0.70, ge=0.0, lt=1.0)
    decrease: float = Field(0.9, gt=0.0, lt=1.0)
    increase: int = Field(1, ge=1)
    tolerance: float = Field(1.5, ge=1.0, description="latency: allowed long/short ratio")
    smoothing: float = Field(0.2, gt=0.0, le=1.0)
    long_window: int = Field(600, ge=1)
    timeout_s: float = Field(
        5.0, gt=0.0, description="aimd: a time to first token slower than this is a drop"
    )
    tpot_ms: float = Field(
        50.0, gt=0.0, le=60_000.0, description="slo: target time per output token (ms)"
    )
    ttft_ms: float = Field(
        1000.0,
        gt=0.0,
        le=3_600_000.0,
        description="slo: target time to first token, from admission (ms)",
    )
    quantile: float = Field(
        0.9, gt=0.0, le=1.0, description="slo: the quantile of a window that must meet targets"
    )
    window: int = Field(32, ge=1, le=100_000, description="slo: answers per decision")

    @model_validator(mode="after")
    def _watermarks_ordered(self) -> AdaptiveSpec:
        if self.low_water >= self.high_water:
            raise ValueError(
                f"low_water ({self.low_water}) must be below high_water ({self.high_water})"
            )
        return self
