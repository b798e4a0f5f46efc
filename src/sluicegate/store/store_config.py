"""The ``distributed:`` block of the configuration: how a replica uses the shared store
(DESIGN §16). Its fields are read by ``gateway/distributed`` and ``gateway/workers``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

_EXPECTED_REPLICAS = (
    "replicas sharing the store, for a replica that starts while it is down: fail_open keeps "
    "1/expected_replicas of every limit; unset, 503 store_unavailable until it first answers"
)


class DistributedSpec(BaseModel):
    """Distributed mode: how this replica uses the shared store (``store: redis://...``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    on_store_failure: Literal["fail_open", "fail_closed"] = Field(
        "fail_open",
        description="store unreachable: local limits at 1/replicas (fail_open) or 503 "
        "store_unavailable (fail_closed)",
    )
    lease_ttl_s: float = Field(
        5.0, ge=0.5, le=300.0, description="a dead replica's slots are freed within this"
    )
    timeout_ms: float = Field(
        50.0, gt=0.0, le=5000.0, description="a store round trip slower than this is a failure"
    )
    key_prefix: str = Field(
        "sluicegate",
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="prefix of every key in the store (one per gateway fleet)",
    )
    replica_id: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="this replica's name in the store; default hostname-pid-random",
    )
    expected_replicas: int | None = Field(None, ge=1, le=10_000, description=_EXPECTED_REPLICAS)
    cluster: bool = Field(
        False, description="the store URL names a node of a Redis Cluster (or Valkey cluster)"
    )
