"""Typed, validated scheduling configuration: models, lanes, backends, tenants.

These are the scheduler's inputs. ``sluicegate.config`` reads them from YAML
(adding what only the gateway needs, such as API keys); the simulator builds
them directly. Validation happens at construction and names the bad field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sluicegate.core.ticket import MAX_PRIORITY, MIN_PRIORITY


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AfterFraction(_Spec):
    """Preemptible only once this fraction of ``max_tokens`` has been generated."""

    after_fraction: float = Field(0.8, ge=0.0, le=1.0)


Preemptibility = Literal["priority", "never", "always"] | AfterFraction


class LaneSpec(_Spec):
    """One traffic class of a model: its own queue, cap, timeout, SLO and policy."""

    name: str = Field(min_length=1)
    max_concurrency: int = Field(16, ge=1, le=100_000)
    max_queue: int = Field(1024, ge=0, le=10_000_000)
    queue_timeout_s: float = Field(60.0, gt=0.0)
    slo_ms: float = Field(30_000.0, gt=0.0)
    policy: str = "slack"
    preemptible: Preemptibility = "priority"
    preempt_action: Literal["abort", "requeue"] = "abort"
    max_requeues: int = Field(1, ge=0, le=100)
    preempt_after_ms: float | None = Field(None, gt=0.0)
    borrow: bool = True
    lend: bool = True
    shed_hopeless: bool = False
    aging: float = Field(
        1.0, ge=0.0, description="sjf: seconds of predicted service forgiven per second waited"
    )

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        from sluicegate.core.policies import policy_names

        if value not in policy_names():
            raise ValueError(f"unknown policy {value!r}; choose one of {sorted(policy_names())}")
        return value


class BackendSpec(_Spec):
    """One engine replica serving a model."""

    name: str = Field(min_length=1)
    url: str | None = None
    weight: float = Field(1.0, gt=0.0, le=1000.0)
    max_concurrency: int | None = Field(None, ge=1)
    engine: Literal["vllm", "sglang", "llamacpp", "tgi", "trtllm", "emulator"] = "vllm"


class AdaptiveSpec(_Spec):
    """Adaptive concurrency limit for a model (DESIGN §5).

    ``kv_cache``: multiply by ``decrease`` above ``high_water`` KV usage, add
    ``increase`` below ``low_water``. ``latency``: Gradient2 on latency samples
    (time to first token, or a unary answer's time per output token), and
    ``1 - smoothing / 2`` per drop. ``aimd``: multiply by ``decrease`` (at least
    one less) per drop or first token slower than ``timeout_s``, add
    ``increase`` per other answer while at least half the limit is in use.
    What counts as a drop or a sample: ``sluicegate.core.limits.feedback``.
    """

    mode: Literal["kv_cache", "latency", "aimd"] = "kv_cache"
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

    @model_validator(mode="after")
    def _watermarks_ordered(self) -> AdaptiveSpec:
        if self.low_water >= self.high_water:
            raise ValueError(
                f"low_water ({self.low_water}) must be below high_water ({self.high_water})"
            )
        return self


def default_lanes() -> tuple[LaneSpec, ...]:
    """The three lanes a model gets when its config names none."""
    return (
        LaneSpec(
            name="interactive",
            max_concurrency=32,
            max_queue=256,
            queue_timeout_s=30.0,
            slo_ms=20_000.0,
            policy="slack",
            preemptible="never",
        ),
        LaneSpec(
            name="batch",
            max_concurrency=16,
            max_queue=2048,
            queue_timeout_s=300.0,
            slo_ms=120_000.0,
            policy="fair",
            preemptible=AfterFraction(after_fraction=0.8),
        ),
        LaneSpec(
            name="best_effort",
            max_concurrency=8,
            max_queue=8192,
            queue_timeout_s=600.0,
            slo_ms=600_000.0,
            policy="fifo",
            preemptible="always",
        ),
    )


class ModelSpec(_Spec):
    """A model clients name in ``"model"``: its lanes, backends and model-wide limits."""

    name: str = Field(min_length=1)
    backends: tuple[BackendSpec, ...] = ()
    lanes: tuple[LaneSpec, ...] = Field(default_factory=default_lanes)
    max_concurrency: int = Field(64, ge=1, le=1_000_000)
    max_inflight_tokens: int | None = Field(None, ge=1)
    router: str = "least_inflight"
    adaptive: AdaptiveSpec | None = None
    circuit_failures: int = Field(5, ge=1, description="consecutive failures that open a circuit")
    circuit_cooldown_s: float = Field(10.0, gt=0.0)
    prior_output_tokens: int = Field(256, ge=1)
    prior_prefill_tokens_per_s: float = Field(8000.0, gt=0.0)
    prior_decode_tokens_per_s: float = Field(40.0, gt=0.0)
    preempt_slack_s: float = Field(
        0.0, ge=0.0, description="preempt when a waiter's slack falls below this"
    )

    @field_validator("lanes")
    @classmethod
    def _lanes_unique(cls, lanes: tuple[LaneSpec, ...]) -> tuple[LaneSpec, ...]:
        names = [lane.name for lane in lanes]
        if not names:
            raise ValueError("a model needs at least one lane")
        if len(set(names)) != len(names):
            raise ValueError(f"lane names must be unique, got {names}")
        return lanes

    @field_validator("backends")
    @classmethod
    def _backends_unique(cls, backends: tuple[BackendSpec, ...]) -> tuple[BackendSpec, ...]:
        names = [b.name for b in backends]
        if len(set(names)) != len(names):
            raise ValueError(f"backend names must be unique, got {names}")
        return backends

    @field_validator("router")
    @classmethod
    def _known_router(cls, value: str) -> str:
        from sluicegate.core.routing import router_names

        if value not in router_names():
            raise ValueError(f"unknown router {value!r}; choose one of {sorted(router_names())}")
        return value

    def lane(self, name: str) -> LaneSpec:
        """The lane called ``name``; ``KeyError`` if there is none."""
        for lane in self.lanes:
            if lane.name == name:
                return lane
        raise KeyError(name)


class TenantSpec(_Spec):
    """Who pays: fair-share weight, rate limits, lanes and priorities allowed."""

    name: str = Field(min_length=1)
    weight: float = Field(1.0, gt=0.0, le=1_000_000.0)
    requests_per_s: float | None = Field(None, gt=0.0)
    burst_requests: float | None = Field(None, ge=1.0)
    tokens_per_min: float | None = Field(None, gt=0.0)
    burst_tokens: float | None = Field(None, ge=1.0)
    allowed_lanes: tuple[str, ...] | None = None
    default_lane: str = "interactive"
    default_priority: int = Field(2, ge=MIN_PRIORITY, le=MAX_PRIORITY)
    max_priority: int = Field(
        MIN_PRIORITY,
        ge=MIN_PRIORITY,
        le=MAX_PRIORITY,
        description="the most important (lowest) priority this tenant may ask for",
    )


class SchedulerSpec(_Spec):
    """Everything the scheduler needs: models and tenants."""

    models: tuple[ModelSpec, ...]
    tenants: tuple[TenantSpec, ...] = ()
    global_slots: bool = Field(
        False, description="distributed mode: every admission first reserves a global slot"
    )

    @field_validator("models")
    @classmethod
    def _models_unique(cls, models: tuple[ModelSpec, ...]) -> tuple[ModelSpec, ...]:
        names = [m.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        return models

    @field_validator("tenants")
    @classmethod
    def _tenants_unique(cls, tenants: tuple[TenantSpec, ...]) -> tuple[TenantSpec, ...]:
        names = [t.name for t in tenants]
        if len(set(names)) != len(names):
            raise ValueError(f"tenant names must be unique, got {names}")
        return tenants
