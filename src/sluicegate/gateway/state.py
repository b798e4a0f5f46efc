"""Everything a request handler needs, built once from the configuration."""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Mapping, Sequence

from sluicegate.config import Config
from sluicegate.core.preemption import ever_preemptible
from sluicegate.core.scheduler import Scheduler
from sluicegate.core.spec import LaneSpec, ModelSpec, TenantSpec
from sluicegate.core.ticket import MAX_PRIORITY, MIN_PRIORITY, BackendStats
from sluicegate.engine_profiles import EngineProfile, profile
from sluicegate.gateway.asyncio_driver import SchedulerDriver
from sluicegate.gateway.clock import Clock, wall_anchored_clock
from sluicegate.gateway.distributed.distributed_metrics import StoreMetrics
from sluicegate.gateway.distributed.store_link import StoreLink
from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.ops.pressure_loop import PressureLoop, fleet_lease
from sluicegate.gateway.ops.pressure_metrics import PressureGauges
from sluicegate.gateway.request.auth import KeyRing, only_bearer
from sluicegate.gateway.request.gateway_metrics import GatewayMetrics
from sluicegate.gateway.upstream.clients import Upstream, upstream_limits
from sluicegate.store.keys import default_replica_id
from sluicegate.store.redis_store import RedisStore

ANONYMOUS = "anonymous"


class GatewayState:
    """Config, key ring, scheduler driver, metrics and upstream client of one gateway process.

    With no tenant API keys configured the gateway runs open: every request
    belongs to one ``anonymous`` tenant with default limits. ``clock`` is the
    scheduling clock (``gateway/clock.py``): the driver, and through it every
    handler, the metrics and the ops endpoints, read time from it.
    """

    def __init__(
        self,
        config: Config,
        environ: Mapping[str, str] | None = None,
        *,
        clock: Clock = time.monotonic,
    ) -> None:
        env = os.environ if environ is None else environ
        self.config = config
        keys = config.api_keys(env)
        admin_env = config.server.admin_key_env
        admin_key = env.get(admin_env) if admin_env else None
        self.keys = KeyRing(keys, admin_key or None)
        self.auth_required = bool(keys)
        self.anonymous_tenant = ANONYMOUS
        self.models: dict[str, ModelSpec] = {model.name: model for model in config.models}
        self._tenants: dict[str, TenantSpec] = {t.name: t for t in config.scheduler_spec().tenants}
        self._default_tenant = TenantSpec(name=ANONYMOUS)
        senders = list(self._tenants.values()) + ([] if keys else [self._default_tenant])
        self._keeps_text = {
            (model.name, lane.name, priority): _keeps_text(model, lane, priority, senders)
            for model in config.models
            for lane in model.lanes
            for priority in range(MIN_PRIORITY, MAX_PRIORITY + 1)
        }
        self._urls = {
            (model.name, backend.name): (backend.url or "").rstrip("/")
            for model in config.models
            for backend in model.backends
        }
        self._profiles = {
            (model.name, backend.name): profile(backend.engine)
            for model in config.models
            for backend in model.backends
        }
        self._priority_fields = {
            (model.name, backend.name): profile(backend.engine).priority_field
            for model in config.models
            for backend in model.backends
            if backend.priority_passthrough
        }
        self.scheduler = Scheduler(config.scheduler_spec())
        self.link: StoreLink | None = None
        if config.shared_store:
            self.link = _store_link(config, self.scheduler, self._tenants)
            if clock is time.monotonic:
                # Queue orders compare times across replicas: read them on the wall clock.
                clock = wall_anchored_clock()
        self.driver = SchedulerDriver(self.scheduler, clock=clock, link=self.link)
        for model in config.models:
            if model.wait_for_backends:
                # Unprobed: an engine scaled to zero must not get the first requests (502);
                # they wait until a probe finds it up.
                for backend in model.backends:
                    down = BackendStats(model.name, backend.name, healthy=False)
                    self.scheduler.observe_backend(down, self.driver.now())
        self.metrics = GatewayMetrics(
            self.scheduler,
            self._tenants,
            self.driver.now,
            tenant_label=config.server.metrics_tenant_label,
        )
        if self.link is not None:
            link = self.link
            link.metrics = StoreMetrics(
                self.metrics.registry,
                is_global=lambda: link.is_global,
                replicas=lambda: link.replicas,
                counts=lambda: link.counts,
                view=link.view,
                exposed_tenant=(
                    None
                    if config.server.metrics_tenant_label == "none"
                    else self.metrics.exposed_tenant
                ),
            )
        self.upstream = Upstream(
            connect_timeout_s=config.server.upstream_connect_timeout_s,
            limits=upstream_limits(config.server),
        )
        self.pressure: PressureLoop | None = None
        if config.pressure is not None:
            lease = None if self.link is None else fleet_lease(config, self.link.replica)
            self.pressure = PressureLoop(config.pressure, config.models, env, lease=lease)
            self.metrics.registry.register(PressureGauges(self.pressure, self.scheduler))

    def tenant_of(self, authorization: Sequence[str]) -> str:
        """The tenant a request's ``Authorization`` values name (the anonymous tenant when
        the gateway runs open); ``GatewayError(401)`` for a missing, unknown or doubled key."""
        if not self.auth_required:
            return self.anonymous_tenant
        token = only_bearer(authorization)
        tenant = self.keys.tenant(token) if token is not None else None
        if tenant is None:
            raise GatewayError(401, "invalid_api_key", "missing or unknown API key")
        return tenant

    @property
    def configured_tenants(self) -> Collection[str]:
        """The configured tenants' names (state and metrics show any other as ``other``)."""
        return self._tenants.keys()

    def tenant_spec(self, tenant: str) -> TenantSpec:
        """The tenant's scheduling settings (defaults for the anonymous tenant)."""
        return self._tenants.get(tenant, self._default_tenant)

    def profile(self, model: str, backend: str) -> EngineProfile:
        """The profile of a backend's engine (``sluicegate.engine_profiles``)."""
        return self._profiles[(model, backend)]

    def priority_field(self, model: str, backend: str) -> str | None:
        """The engine's priority field a backend's requests carry (``priority_passthrough``),
        or None."""
        return self._priority_fields.get((model, backend))

    def keeps_alive(self, model: str, backend: str) -> bool:
        """Whether upstream connections to a backend are pooled (not for llama-cpp-python's
        server, which drops connections after some answers without saying so)."""
        return self._profiles[(model, backend)].keeps_alive

    def streams_to_keep_text(self, model: str, lane: str, priority: int) -> bool:
        """Whether a non-streamed ticket of ``priority`` in ``lane`` of ``model`` goes
        upstream as a stream so that a preemption keeps its text: its lane aborts, and it
        could ever be preempted (``core.preemption.ever_preemptible``)."""
        return self._keeps_text[(model, lane, priority)]

    def streams_unary(self, model: str, backend: str) -> bool:
        """Whether non-streamed requests go to a backend as streams: its engine keeps
        generating a non-streamed request after its client has left (its profile's
        ``streams_unary``), and only a stream's end stops it."""
        return self._profiles[(model, backend)].streams_unary

    def backend_url(self, model: str, backend: str) -> str:
        """The configured base URL of a backend (never taken from a request)."""
        return self._urls[(model, backend)]


def _keeps_text(
    model: ModelSpec, lane: LaneSpec, priority: int, senders: Sequence[TenantSpec]
) -> bool:
    """``GatewayState.streams_to_keep_text`` for one (model, lane, priority); ``senders``:
    the tenants that may send (the anonymous one in an open gateway). The most important
    priority a ticket of ``model`` can have is the lowest ``max_priority`` of those that
    may use one of its lanes."""
    if lane.preempt_action != "abort":
        return False
    lanes = {other.name for other in model.lanes}
    most_important = min(
        (
            tenant.max_priority
            for tenant in senders
            if tenant.allowed_lanes is None or lanes.intersection(tenant.allowed_lanes)
        ),
        default=MAX_PRIORITY,
    )
    return ever_preemptible(model, lane, priority, most_important, streaming=False)


def _store_link(
    config: Config, scheduler: Scheduler, tenants: Mapping[str, TenantSpec]
) -> StoreLink:
    """The link to the shared store of ``config.store`` (distributed mode)."""
    settings = config.distributed

    def open_store(replica: str) -> RedisStore:
        return RedisStore(
            config.store,
            prefix=settings.key_prefix,
            replica=replica,
            lease_ttl_s=settings.lease_ttl_s,
            timeout_s=settings.timeout_ms / 1000.0,
            cluster=settings.cluster,
        )

    replica = settings.replica_id or default_replica_id()
    return StoreLink(open_store, replica, settings, scheduler, tenants)
