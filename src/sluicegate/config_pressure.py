"""The ``pressure:`` section of the configuration: Prometheus queries that tighten admission
lane by lane while the cluster is busy (DESIGN §5; the loop is ``gateway/ops/pressure_loop.py``)."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

__all__ = ["PressureSignalSpec", "PressureSpec"]


def _not_above(value: float | None, info: ValidationInfo, bound: str) -> float | None:
    """``value`` of field ``info.field_name``, refused when above the already validated
    field ``bound`` (so the error names the field that is wrong, and its line)."""
    limit = info.data.get(bound)
    if value is not None and limit is not None and value > limit:
        raise ValueError(f"{info.field_name} ({value}) is above {bound} ({limit})")
    return value


class PressureSignalSpec(BaseModel):
    """One Prometheus query the pressure loop polls, and the values that move it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_.:-]*$")
    query: str = Field(min_length=1, description="PromQL; the largest sample of the answer counts")
    threshold: float = Field(allow_inf_nan=False, description="above it: tighten one more lane")
    clear_below: float | None = Field(
        None,
        allow_inf_nan=False,
        description="at or below it on every signal: loosen one lane (default: threshold)",
    )

    @field_validator("clear_below")
    @classmethod
    def _clear_not_above_threshold(cls, value: float | None, info: ValidationInfo) -> float | None:
        return _not_above(value, info, "threshold")


class PressureSpec(BaseModel):
    """Cluster pressure: Prometheus queries that tighten admission lane by lane."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prometheus_url: str = Field(
        description="base URL of the Prometheus HTTP API, e.g. http://prometheus:9090"
    )
    interval_s: float = Field(5.0, ge=0.5, le=3600.0, description="poll period; one step per poll")
    timeout_s: float | None = Field(
        None,
        gt=0.0,
        le=60.0,
        description="per poll, all queries together; default min(2, interval_s)",
    )
    bearer_token_env: str | None = Field(
        None, description="environment variable holding a bearer token for Prometheus"
    )
    signals: tuple[PressureSignalSpec, ...] = Field(min_length=1)

    @field_validator("prometheus_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
            raise ValueError(
                "must be an http:// or https:// URL with a host and no query,"
                " e.g. http://prometheus:9090"
            )
        return value.rstrip("/")

    @field_validator("timeout_s")
    @classmethod
    def _timeout_within_interval(cls, value: float | None, info: ValidationInfo) -> float | None:
        return _not_above(value, info, "interval_s")

    @field_validator("signals")
    @classmethod
    def _names_unique(
        cls, signals: tuple[PressureSignalSpec, ...]
    ) -> tuple[PressureSignalSpec, ...]:
        names = [signal.name for signal in signals]
        if len(set(names)) != len(names):
            raise ValueError(f"signal names must be unique, got {names}")
        return signals

    @property
    def poll_timeout_s(self) -> float:
        """The time a poll may take: ``timeout_s``, by default min(2 s, ``interval_s``)."""
        return self.timeout_s if self.timeout_s is not None else min(2.0, self.interval_s)
