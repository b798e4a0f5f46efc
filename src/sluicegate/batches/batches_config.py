"""The ``batches:`` section of the config: where batch state lives and how lines run."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sluicegate.batches.batch_backend import Quota
from sluicegate.core.ticket import MAX_PRIORITY, MIN_PRIORITY

_WINDOW = re.compile(r"^([1-9][0-9]{0,6})([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def window_seconds(window: str) -> int | None:
    """Seconds of a completion window such as ``24h``, ``30m`` or ``90s``; None if malformed."""
    match = _WINDOW.match(window)
    if match is None:
        return None
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def _duration(value: str | None) -> str | None:
    if value is not None and window_seconds(value) is None:
        raise ValueError("a duration such as 30d, 24h, 90m or 3600s (or null: never)")
    return value


class TenantQuota(BaseModel):
    """One tenant's own quota (``batches.quota.tenants``): a field it leaves unset is the
    default's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_bytes: int | None = Field(None, ge=0, description="bytes stored (files and outputs)")
    max_files: int | None = Field(None, ge=0, description="files stored")
    max_active_batches: int | None = Field(None, ge=0, description="batches not yet over")


class QuotaSpec(BaseModel):
    """What one tenant may keep in the shared batch store (429 ``quota_exceeded`` above);
    ``null``: no limit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_bytes: int | None = Field(
        1024**3,
        ge=0,
        description="bytes a tenant's files (uploads, outputs and error files) take at most",
    )
    max_files: int | None = Field(500, ge=0, description="files a tenant keeps at most")
    max_active_batches: int | None = Field(
        20, ge=0, description="batches of a tenant not yet over (validating to cancelling)"
    )
    tenants: dict[str, TenantQuota] = Field(
        default_factory=dict, description="per tenant name, fields that differ from these"
    )

    def of(self, tenant: str) -> Quota:
        """The quota of ``tenant``: its own fields where it has them, else these."""
        own = self.tenants.get(tenant)
        fields = {name: getattr(self, name) for name in Quota.__dataclass_fields__}
        if own is not None:
            fields.update({name: getattr(own, name) for name in own.model_fields_set})
        return Quota(**fields)


class BatchesSpec(BaseModel):
    """The durable batch lane (``POST /v1/files``, ``/v1/batches``): off unless configured.

    Every file, batch, line and result lives in one SQLite database (WAL) at
    ``path``; an upload or a create is answered only after its write is on disk.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str | None = Field(
        None,
        min_length=1,
        description="the SQLite database holding batch state; in distributed mode (a redis://"
        " store) unset: state lives in the shared store",
    )
    store: str | None = Field(
        None,
        min_length=1,
        description="distributed mode: a Redis (redis://, rediss://, unix://) of its own for"
        " batch data, apart from the limits' store; unset: the shared store",
    )
    store_timeout_s: float = Field(
        2.0,
        gt=0.0,
        le=60.0,
        description="a Redis call of the batch lane slower than this fails: the API answers"
        " 503 storage_unavailable",
    )
    lane: str = Field(
        "best_effort",
        min_length=1,
        description="the lane lines run in unless a create asks for another with X-Sluicegate-Lane",
    )
    priority: int = Field(
        MAX_PRIORITY,
        ge=MIN_PRIORITY,
        le=MAX_PRIORITY,
        description="the priority lines run at (5, the least important, by default)",
    )
    max_file_bytes: int = Field(
        200 * 1024 * 1024, ge=1024, le=4 * 1024**3, description="largest upload (413 above)"
    )
    max_lines: int = Field(50_000, ge=1, le=10_000_000, description="lines per input file")
    max_line_bytes: int = Field(
        1024 * 1024, ge=256, description="one request line at most (an error line above)"
    )
    max_inflight: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="lines one gateway process runs at once per model; unset: the model's "
        "max_concurrency",
    )
    max_completion_window: str = Field(
        "24h", description="the longest completion_window a create may ask for"
    )
    lease_s: float = Field(
        30.0,
        ge=1.0,
        le=3600.0,
        description="a line claimed by a process that died runs again after this",
    )
    max_attempts: int = Field(
        3, ge=1, le=100, description="engine failures (5xx) of one line before it is an error"
    )
    yield_hold_s: float = Field(
        5.0,
        ge=0.0,
        le=3600.0,
        description="a preempted line keeps its place in the window empty this long, so the"
        " batch gives slots back while interactive traffic lasts (0: refill at once)",
    )
    poll_interval_s: float = Field(
        0.5, gt=0.0, le=60.0, description="how often the runner looks for new work"
    )
    quota: QuotaSpec = Field(
        default_factory=QuotaSpec, description="what one tenant may keep (per-tenant quotas)"
    )
    file_retention: str | None = Field(
        "30d",
        description="how long a file (upload, output or error file) is kept at most; an upload"
        " may ask for less with expires_after; null: until deleted",
    )
    batch_retention: str | None = Field(
        "30d", description="how long a batch is kept once over; null: until the store is wiped"
    )
    sweep_interval_s: float = Field(
        60.0, gt=0.0, le=86400.0, description="how often expired files and batches are deleted"
    )

    _retention = field_validator("file_retention", "batch_retention")(_duration)

    @field_validator("store")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        # The value is not echoed: a store URL may carry a password.
        if value is None:
            return value
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("the URL of a Redis or Valkey: redis://, rediss:// or unix://")
        from sluicegate.store.redis_url import parse_redis_url

        parse_redis_url(value)  # its errors name the part, never the URL
        return value

    @field_validator("max_completion_window")
    @classmethod
    def _window(cls, value: str) -> str:
        if window_seconds(value) is None:
            raise ValueError("a duration such as 24h, 90m or 3600s")
        return value

    @property
    def max_window_s(self) -> int:
        """``max_completion_window`` in seconds."""
        seconds = window_seconds(self.max_completion_window)
        assert seconds is not None
        return seconds

    @property
    def file_retention_s(self) -> int | None:
        """``file_retention`` in seconds (None: forever)."""
        return None if self.file_retention is None else window_seconds(self.file_retention)

    @property
    def batch_retention_s(self) -> int | None:
        """``batch_retention`` in seconds (None: forever)."""
        return None if self.batch_retention is None else window_seconds(self.batch_retention)
