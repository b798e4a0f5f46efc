"""The YAML configuration file: models, backends, lanes, tenants and server settings.

Validated at start-up by pydantic; an error names the bad field and the line of
the file it came from, e.g. ``models[0].lanes[1].max_queue (line 23): Input
should be greater than or equal to 0``. API keys are never written in the
file: each tenant names an environment variable that holds its key.

A file for the gateway (``serve``, ``check-config``) may not name the
simulation-only policies (``oracle``, ``slack-oracle``); one for ``simulate``
may (``simulation=True``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sluicegate.batches.batches_config import BatchesSpec
from sluicegate.calibrate.preset_file import PresetName
from sluicegate.config_pressure import PressureSpec
from sluicegate.core.policies import policy_names, simulation_only_policies
from sluicegate.core.spec import ModelSpec, SchedulerSpec, TenantSpec
from sluicegate.engine_profiles import profile
from sluicegate.errors import SluicegateError
from sluicegate.store.store_config import DistributedSpec

Location = tuple[int | str, ...]
"""Where a value sits in the file, e.g. ``("models", 0, "lanes", 1, "policy")``."""


class ConfigError(SluicegateError, ValueError):
    """The configuration is invalid; the message lists every problem with its location."""


class ServerSpec(BaseModel):
    """Listening address, limits on what clients may send, and the admin key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024)
    admin_key_env: str | None = Field(
        "SLUICEGATE_ADMIN_KEY", description="environment variable holding the admin key"
    )
    chars_per_token: float = Field(4.0, gt=0.0, description="prompt token estimate: chars / this")
    default_max_tokens: int = Field(1024, ge=1, description="when a request gives no max_tokens")
    scrape_interval_s: float = Field(2.0, gt=0.0)
    upstream_connect_timeout_s: float = Field(5.0, gt=0.0, description="TCP connect to an engine")
    upstream_first_byte_timeout_s: float = Field(
        300.0,
        gt=0.0,
        description="forwarding to the engine's first byte (headers; for a stream, first event)",
    )
    upstream_idle_timeout_s: float = Field(
        60.0, gt=0.0, description="longest silence tolerated from an engine mid-answer"
    )
    client_header_timeout_s: float = Field(
        10.0, gt=0.0, description="first byte of a request to the end of its headers (408)"
    )
    client_body_timeout_s: float = Field(
        30.0, gt=0.0, description="end of the headers to the end of the body (408)"
    )
    client_stall_timeout_s: float = Field(
        30.0, gt=0.0, description="a streaming client that stops reading is dropped after this"
    )
    client_write_buffer_bytes: int = Field(
        256 * 1024, ge=4096, description="response bytes buffered per connection at most"
    )
    max_header_bytes: int = Field(32 * 1024, ge=1024, description="request line + headers (431)")
    max_headers: int = Field(100, ge=8, description="header fields per request (431)")
    max_upstream_head_bytes: int = Field(
        64 * 1024,
        ge=1024,
        le=16 * 1024 * 1024,
        description="an engine answer's status lines and headers, 1xx answers included (502)",
    )
    max_upstream_headers: int = Field(
        100, ge=8, le=10_000, description="header fields of an engine answer (502)"
    )
    max_upstream_body_bytes: int = Field(
        256 * 1024 * 1024,
        ge=64 * 1024,
        description="an engine answer read whole (non-streamed), as it arrives (502)",
    )
    dashboard: bool = Field(True, description="serve the live page /dashboard (admin key)")
    metrics_key_env: str | None = Field(
        None, description="environment variable holding the key /metrics needs (none: open)"
    )
    metrics_tenant_label: Literal["name", "hash", "none"] = Field(
        "name", description="tenant label of metrics: the name, a 12-hex hash of it, or none"
    )


class TenantConfig(TenantSpec):
    """A tenant plus the environment variable holding its API key."""

    api_key_env: str | None = Field(None, description="environment variable holding the API key")


class SimulationSpec(BaseModel):
    """What the simulator needs beyond the gateway's config: the engine and how many replicas."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    preset: PresetName = "llama-3.1-8b-h100"
    replicas: int = Field(1, ge=1, le=10_000)
    scrape_interval_s: float = Field(1.0, gt=0.0)
    kv_event_delay_s: float = Field(0.0, ge=0.0, le=60.0, description="KV events' lag, s")


STALE_SCRAPES = 5
"""``metrics_stale_after_s: auto``: this many scrape intervals without a good scrape."""

STORE_SCHEMES = ("redis://", "rediss://", "unix://")
"""The URL schemes of a shared store (Redis or Valkey): distributed mode."""


def redacted_store(url: str) -> str:
    """``url`` without its user name and password, fit for logs and screens."""
    if url == "memory":
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class Config(BaseModel):
    """The whole configuration file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    server: ServerSpec = Field(default_factory=ServerSpec)
    models: tuple[ModelSpec, ...] = Field(min_length=1)
    tenants: tuple[TenantConfig, ...] = ()
    store: str = Field(
        "memory",
        description="where scheduling state lives: memory, or redis:// (rediss://, unix://) "
        "shared by every gateway replica",
    )
    distributed: DistributedSpec = Field(
        default_factory=DistributedSpec,
        description="distributed mode settings (with a redis:// store)",
    )
    pressure: PressureSpec | None = Field(
        None, description="tighten admission while Prometheus queries say the cluster is busy"
    )
    batches: BatchesSpec | None = Field(
        None, description="the durable batch lane (OpenAI Files and Batches APIs); off if unset"
    )
    simulation: SimulationSpec = Field(default_factory=SimulationSpec)

    @field_validator("store", mode="before")
    @classmethod
    def _known_store(cls, value: object) -> object:
        # The value is not echoed: a store URL may carry a password.
        if value == "memory":
            return value
        if isinstance(value, str) and value.startswith(STORE_SCHEMES):
            from sluicegate.store.redis_url import parse_redis_url

            parse_redis_url(value)  # its errors name the part, never the URL
            return value
        raise ValueError(
            "must be 'memory' (state in this one gateway process) or the URL of a Redis or "
            f"Valkey server shared by every replica, starting with one of {list(STORE_SCHEMES)}"
        )

    @property
    def shared_store(self) -> bool:
        """Whether state lives in a shared store (distributed mode)."""
        return self.store != "memory"

    @model_validator(mode="after")
    def _cross_checks(self) -> Config:
        if "distributed" in self.model_fields_set and not self.shared_store:
            raise ValueError(
                "distributed: is set but store is 'memory'; distributed mode needs a shared "
                "store, e.g. store: redis://host:6379/0"
            )
        if self.distributed.cluster:
            from sluicegate.store.redis_url import check_cluster_url

            check_cluster_url(self.store)
        names = [model.name for model in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        for model in self.models:
            self._check_engines(model)
        lanes = {lane.name for model in self.models for lane in model.lanes}
        if self.batches is not None:
            self._check_batches(self.batches, lanes)
        for tenant in self.tenants:
            unknown = set(tenant.allowed_lanes or ()) - lanes
            if unknown:
                raise ValueError(f"tenant {tenant.name!r} allows unknown lanes {sorted(unknown)}")
            if tenant.default_lane not in lanes:
                raise ValueError(
                    f"tenant {tenant.name!r} has unknown default_lane {tenant.default_lane!r}"
                )
        return self

    def _check_engines(self, model: ModelSpec) -> None:
        """What a backend asks of its engine's profile, and staleness against the scrapes."""
        stale = model.metrics_stale_after_s
        if isinstance(stale, float) and stale <= self.server.scrape_interval_s:
            raise ValueError(
                f"models[{model.name}].metrics_stale_after_s: {stale} s is not longer than "
                f"server.scrape_interval_s ({self.server.scrape_interval_s} s): every backend "
                "would count as full between two scrapes"
            )
        for backend in model.backends:
            engine = profile(backend.engine)
            where = f"models[{model.name}].backends[{backend.name}]"
            if engine.metric_names and engine.metrics_path is None and not backend.metrics_url:
                why = "exports its metrics on a port of its own (ray start --metrics-export-port)"
                raise ValueError(f"{where}.metrics_url: engine {engine.name!r} {why}: give it")
            if backend.priority_passthrough and engine.priority_field is None:
                raise ValueError(
                    f"{where}.priority_passthrough: engine {engine.name!r} has no priority "
                    "scheduler to hand the priority to"
                )

    def _check_batches(self, batches: BatchesSpec, lanes: set[str]) -> None:
        if batches.lane not in lanes:
            raise ValueError(
                f"batches.lane: no model has a lane {batches.lane!r}; name one of {sorted(lanes)}"
            )
        if self.shared_store and batches.path is not None:
            raise ValueError(
                "batches.path: in distributed mode batch state lives in the shared store "
                "(store:), so that every replica serves every batch; remove batches.path"
            )
        if batches.store is None and self.distributed.cluster:
            raise ValueError(
                "batches.store: the batch lane's Redis backend does not speak the cluster "
                "protocol; with distributed.cluster give it a plain Redis (redis://host:port/0)"
            )
        if batches.store is not None and not self.shared_store:
            raise ValueError(
                "batches.store: a separate Redis for batch data is for distributed mode "
                "(store: redis://…); with store: memory batch state is the SQLite file "
                "batches.path"
            )
        if not self.shared_store and batches.path is None:
            raise ValueError(
                "batches.path: the SQLite database that holds batch state is required "
                "(e.g. /var/lib/sluicegate/batches.db)"
            )
        unknown = set(batches.quota.tenants) - {t.name for t in self.tenants} - {"anonymous"}
        if unknown:
            raise ValueError(f"batches.quota.tenants: no such tenants {sorted(unknown)}")

    def scheduler_spec(self) -> SchedulerSpec:
        """The part of the config the scheduler runs on."""
        tenants = tuple(
            TenantSpec.model_validate(t.model_dump(exclude={"api_key_env"})) for t in self.tenants
        )
        auto = STALE_SCRAPES * self.server.scrape_interval_s
        models = tuple(
            model.model_copy(update={"metrics_stale_after_s": auto})
            if model.metrics_stale_after_s == "auto"
            else model
            for model in self.models
        )
        return SchedulerSpec(models=models, tenants=tenants)

    def api_keys(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """Map of API key → tenant name, read from the environment variables the tenants name.

        Raises:
            ConfigError: a named variable is unset or empty (its name is given, never a key).
        """
        env = os.environ if environ is None else environ
        keys: dict[str, str] = {}
        for tenant in self.tenants:
            if tenant.api_key_env is None:
                continue
            key = env.get(tenant.api_key_env, "")
            if not key:
                raise ConfigError(
                    f"tenants[{tenant.name}].api_key_env: environment variable "
                    f"{tenant.api_key_env} is not set"
                )
            if key in keys:
                raise ConfigError(f"tenants[{tenant.name}]: API key shared with another tenant")
            keys[key] = tenant.name
        return keys


def _line_of(node: yaml.Node | None, loc: Sequence[int | str]) -> int | None:
    """The 1-based line in the YAML file where the value at ``loc`` starts."""
    line = None if node is None else node.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            child = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            child = node.value[part] if 0 <= part < len(node.value) else None
        else:
            child = None
        if child is None:
            break
        node = child
        line = node.start_mark.line + 1
    return line


def _describe(loc: Sequence[int | str]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def gateway_problems(config: Config) -> list[tuple[Location, str]]:
    """What a valid config asks of a running gateway that only the simulator can do.

    Returns each problem's location and why; empty when the gateway can run it.
    """
    simulation_only = simulation_only_policies()
    choices = sorted(policy_names() - simulation_only)
    problems: list[tuple[Location, str]] = []
    for m, model in enumerate(config.models):
        for i, lane in enumerate(model.lanes):
            if lane.policy in simulation_only:
                problems.append(
                    (
                        ("models", m, "lanes", i, "policy"),
                        f"lane {lane.name!r} of model {model.name!r}: policy {lane.policy!r} "
                        "is simulation-only (it needs each request's true output length, "
                        f"which only `sluicegate simulate` knows); choose one of {choices}",
                    )
                )
    return problems


def _invalid(source: str, node: yaml.Node | None, problems: Sequence[tuple[Location, str]]) -> str:
    lines = []
    for loc, message in problems:
        line = _line_of(node, loc)
        where = f" (line {line})" if line is not None else ""
        lines.append(f"  {_describe(loc)}{where}: {message}")
    return f"{source}: invalid configuration\n" + "\n".join(lines)


def parse_config(text: str, *, source: str = "<config>", simulation: bool = False) -> Config:
    """Validate YAML text; ``ConfigError`` lists each bad field with its line.

    Args:
        text: the YAML.
        source: the file name the messages start with.
        simulation: the config is for ``sluicegate simulate``, which may also run
            the simulation-only policies; otherwise ``gateway_problems`` are errors.
    """
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        problems: list[tuple[Location, str]] = []
        errors = exc.errors()
        locs = [tuple(error["loc"]) for error in errors]
        for error in errors:
            loc = tuple(part for part in error["loc"] if isinstance(part, int | str))
            if any(len(o) > len(loc) and o[: len(loc)] == loc for o in locs):
                continue  # a container's error that only echoes a deeper one
            problems.append((loc, error["msg"]))
        raise ConfigError(_invalid(source, node, problems)) from None
    if not simulation and (problems := gateway_problems(config)):
        raise ConfigError(_invalid(source, node, problems))
    return config


def load_config(path: str | Path, *, simulation: bool = False) -> Config:
    """Read and validate a YAML config file (``simulation`` as in ``parse_config``)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    return parse_config(text, source=str(path), simulation=simulation)
