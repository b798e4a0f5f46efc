"""The batch lane in a gateway process: its database, API routes, runner, sweeper and
metrics.

Built by ``build_app`` when the config has a ``batches:`` section; started and
stopped with the app. Without one, ``/v1/files`` and ``/v1/batches`` answer 404
``batches_disabled``, saying how to turn them on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sluicegate.batches.batch_backend import BatchBackend
from sluicegate.batches.redis.redis_batches import RedisBatches
from sluicegate.batches.sqlite.sqlite_batches import SqliteBatches
from sluicegate.config import Config
from sluicegate.gateway.batch_lane.batch_api import BatchApi
from sluicegate.gateway.batch_lane.batch_metrics import BatchProgress
from sluicegate.gateway.batch_lane.line_runner import BatchRunner
from sluicegate.gateway.batch_lane.sweeper import BatchSweeper
from sluicegate.gateway.distributed.siblings import WorkerTopology
from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.request.handlers import InferenceHandler
from sluicegate.gateway.state import GatewayState

log = logging.getLogger("sluicegate.batches")


def open_backend(config: Config) -> BatchBackend:
    """Where ``config`` keeps batch state: its SQLite file, or (distributed mode, no
    ``batches.path``) ``batches.store``, by default the shared store.

    The path decides, not the store: the workers of ``serve --workers`` run on a private
    store of the supervisor's and share the SQLite file (the config refuses a path beside a
    configured shared store).
    """
    spec = config.batches
    assert spec is not None
    retention = spec.file_retention_s
    if spec.path is not None:
        return SqliteBatches(spec.path, file_retention_s=retention)
    url = config.store if spec.store is None else spec.store
    prefix = config.distributed.key_prefix
    return RedisBatches(
        url, prefix=prefix, file_retention_s=retention, timeout_s=spec.store_timeout_s
    )


class BatchLane:
    """Everything the batch lane needs in one gateway process."""

    def __init__(
        self,
        state: GatewayState,
        inference: Mapping[str, InferenceHandler],
        topology: WorkerTopology | None,
    ) -> None:
        spec = state.config.batches
        assert spec is not None
        self.spec = spec
        self.backend = open_backend(state.config)
        self.api = BatchApi(state, spec, self.backend)
        export = topology is None or topology.index == 0
        self.progress = BatchProgress(state.metrics.registry, export_gauges=export)
        # Lines are served by the same seam as the endpoints' HTTP requests.
        servers = {path: handler.serving for path, handler in inference.items()}
        self.runner = BatchRunner(state, spec, self.backend, servers, self.progress)
        self.sweeper = BatchSweeper(spec, self.backend)
        self.api.on_storage_error = self.progress.storage_error
        self._task: asyncio.Task[None] | None = None
        self._sweeping: asyncio.Task[None] | None = None

    @classmethod
    def of(
        cls,
        state: GatewayState,
        inference: Mapping[str, InferenceHandler],
        topology: WorkerTopology | None,
    ) -> BatchLane | None:
        """The batch lane of ``state``'s config, or None when it has no ``batches:``."""
        if state.config.batches is None:
            return None
        return cls(state, inference, topology)

    def routes(self) -> list[Route]:
        """The Files and Batches API routes."""
        return self.api.routes()

    async def start(self) -> None:
        """Open the database and start the runner and the sweeper."""
        await self.backend.open()
        self._task = asyncio.create_task(self.runner.run())
        self._sweeping = asyncio.create_task(self.sweeper.run())
        log.info("batch lane running as %s", self.runner.owner)

    async def stop(self) -> None:
        """Stop the sweeper and the runner, hand its lines back, close the database."""
        if self._sweeping is not None:
            self._sweeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeping
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            await self.runner.close()
        await self.backend.close()


async def _off(request: Request) -> Response:
    raise GatewayError(
        404,
        "batches_disabled",
        "the Batch and Files APIs are off on this gateway; an operator turns them on with a "
        "batches: section in the config (batches.path: the SQLite database)",
    )


def batch_routes_off() -> list[Route]:
    """The routes a gateway without ``batches:`` answers on the batch paths."""
    methods = ["GET", "POST", "DELETE"]
    return [
        Route(path, _off, methods=methods)
        for path in (
            "/v1/files",
            "/v1/files/{file_id}",
            "/v1/files/{file_id}/content",
            "/v1/batches",
            "/v1/batches/{batch_id}",
            "/v1/batches/{batch_id}/cancel",
        )
    ]
