"""Typed, validated scheduling configuration: models, lanes, backends, tenants.

These are the scheduler's inputs. ``sluicegate.config`` reads them from YAML
(adding what only the gateway needs, such as API keys); the simulator builds
them directly. Validation happens at construction and names the bad field.

Plugin names (a lane's ``policy`` and ``fairness``, a model's ``router`` and
``adaptive.mode``) are checked against the registries, which this module
imports; the specs the plugins themselves are built from (``BackendSpec``,
``AdaptiveSpec``) live below the registries in ``component_specs`` and are
re-exported here.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from sluicegate.core.component_specs import (
    AdaptiveSpec,
    BackendSpec,
    FrozenSpec,
    KvEventsSpec,
    PrefixRoutingSpec,
)
from sluicegate.core.limits import LIMITS
from sluicegate.core.policies import FAIRNESS, resolve_policy
from sluicegate.core.routing import ROUTERS
from sluicegate.core.ticket import MAX_PRIORITY, MIN_PRIORITY

__all__ = [
    "AdaptiveSpec",
    "AfterFraction",
    "BackendSpec",
    "KvEventsSpec",
    "LaneSpec",
    "ModelSpec",
    "Preemptibility",
    "PrefixRoutingSpec",
    "SchedulerSpec",
    "TenantSpec",
    "default_lanes",
]


class AfterFraction(FrozenSpec):
    """Preemptible only once this fraction of ``max_tokens`` has been generated."""

    after_fraction: float = Field(0.8, ge=0.0, le=1.0)


Preemptibility = Literal["priority", "never", "always"] | AfterFraction


class LaneSpec(FrozenSpec):
    """One traffic class of a model: its own queue, cap, timeout, SLO and policy.

    The queue serves tenants by ``fairness`` and orders each tenant's tickets
    by ``policy`` (``queue_policy`` resolves the pair; ``policy: fair`` means
    ``vtc`` fairness with ``slack`` ordering).
    """

    name: str = Field(min_length=1)
    max_concurrency: int = Field(16, ge=1, le=100_000)
    max_queue: int = Field(1024, ge=0, le=10_000_000)
    queue_timeout_s: float = Field(60.0, gt=0.0)
    slo_ms: float = Field(30_000.0, gt=0.0)
    policy: str = "slack"
    fairness: str | None = Field(
        None, description="which tenant next: none or vtc; unset: vtc for policy fair, else none"
    )
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
    pressure_floor: int | None = Field(
        None,
        ge=0,
        le=100_000,
        description="the cap this lane keeps while cluster pressure tightens it (0 closes it);"
        " unset: 0, or max_concurrency (never tightened) for a model's first lane",
    )

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        resolve_policy(value, None)
        return value

    @field_validator("fairness")
    @classmethod
    def _known_fairness(cls, value: str | None) -> str | None:
        if value is not None and value not in FAIRNESS.names():
            raise ValueError(FAIRNESS.unknown(value))
        return value

    @model_validator(mode="after")
    def _policy_and_fairness_agree(self) -> LaneSpec:
        resolve_policy(self.policy, self.fairness)
        return self

    @field_validator("pressure_floor")
    @classmethod
    def _floor_within_cap(cls, value: int | None, info: ValidationInfo) -> int | None:
        cap = info.data.get("max_concurrency")
        if value is not None and cap is not None and value > cap:
            raise ValueError(
                f"pressure_floor ({value}) is above max_concurrency ({cap}):"
                " a floor is what a tightened lane keeps"
            )
        return value

    @property
    def queue_policy(self) -> tuple[str, str]:
        """The (ordering, fairness) names this lane's queue is built from."""
        return resolve_policy(self.policy, self.fairness)


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


KV_WATERMARK = 0.9
"""Fraction of the backends' KV capacity an ``auto`` token budget may fill (DESIGN §5).

Fixed rather than a ``kv_cache`` limit's ``high_water``: the budget is the hard
ceiling against KV preemption, the adaptive limit a controller below it, which a
budget at its own set-point would leave nothing to do."""


class ModelSpec(FrozenSpec):
    """A model clients name in ``"model"``: its lanes, backends and model-wide limits.

    ``max_inflight_tokens``: a number is the budget; ``"auto"`` (the default)
    derives it from the backends' KV capacity once every backend has reported it;
    ``None`` (``null`` or ``off`` in YAML, which also reads as false) means no budget.
    """

    name: str = Field(min_length=1)
    backends: tuple[BackendSpec, ...] = ()
    lanes: tuple[LaneSpec, ...] = Field(default_factory=default_lanes)
    max_concurrency: int = Field(64, ge=1, le=1_000_000)
    max_inflight_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] | None = "auto"
    prefix_routing: PrefixRoutingSpec = Field(default_factory=PrefixRoutingSpec)
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
    metrics_stale_after_s: Annotated[float, Field(gt=0.0, le=86_400.0)] | Literal["auto"] | None = (
        Field(
            "auto",
            description="a backend whose last good metrics scrape is older than this counts "
            "as full (no new request) until one succeeds; auto: 5 scrape intervals; null: never",
        )
    )
    wait_for_backends: bool = Field(
        False,
        description="queue requests while no backend is healthy (an engine scaling from zero)"
        " instead of refusing them with 503 no_healthy_backend",
    )

    @field_validator("max_inflight_tokens", mode="before")
    @classmethod
    def _budget_off(cls, value: object) -> object:
        # YAML reads a bare ``off`` as false.
        if value is False or value == "off":
            return None
        if value is True:
            raise ValueError("max_inflight_tokens: a number of tokens, 'auto', 'off' or null")
        return value

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
        if value not in ROUTERS.names():
            raise ValueError(ROUTERS.unknown(value))
        return value

    @field_validator("adaptive")
    @classmethod
    def _known_limit_mode(cls, value: AdaptiveSpec | None) -> AdaptiveSpec | None:
        if value is not None and value.mode not in LIMITS.names():
            raise ValueError(f"adaptive.mode: {LIMITS.unknown(value.mode)}")
        return value

    def lane(self, name: str) -> LaneSpec:
        """The lane called ``name``; ``KeyError`` if there is none."""
        for lane in self.lanes:
            if lane.name == name:
                return lane
        raise KeyError(name)


class TenantSpec(FrozenSpec):
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


class SchedulerSpec(FrozenSpec):
    """Everything the scheduler needs: models and tenants."""

    models: tuple[ModelSpec, ...]
    tenants: tuple[TenantSpec, ...] = ()

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
