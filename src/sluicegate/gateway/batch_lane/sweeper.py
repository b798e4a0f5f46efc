"""The batch sweeper: deletes what has reached its end, in every process that runs the lane.

Every ``batches.sweep_interval_s`` it deletes files past their ``expires_at``,
batches over for ``batches.batch_retention`` (with their results) and uploads a
dead process left half written, ``STEP`` of each per backend call, so no call
holds the store for long; a full step is followed at once by another. Replicas and
``--workers`` each run one: the backends delete each thing once, and skip what
another process already deleted. What it deletes frees the tenant's quota.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sluicegate.batches.batch_backend import BatchBackend, Swept
from sluicegate.batches.batches_config import BatchesSpec

log = logging.getLogger("sluicegate.batches")
STEP = 200
"""Files, batches and abandoned uploads deleted per backend call at most, of each."""


class BatchSweeper:
    """Runs ``BatchBackend.sweep`` on a timer."""

    def __init__(self, spec: BatchesSpec, backend: BatchBackend) -> None:
        self.spec = spec
        self.backend = backend

    async def sweep_once(self, now: int) -> Swept:
        """Sweep until a step finds less than a full ``STEP``; what was deleted in all."""
        files = batches = uploads = 0
        while True:
            step = await self.backend.sweep(now, self.spec.batch_retention_s, STEP)
            files, batches, uploads = (
                files + step.files,
                batches + step.batches,
                uploads + step.uploads,
            )
            if max(step.files, step.batches, step.uploads) < STEP:
                return Swept(files, batches, uploads)

    async def run(self) -> None:
        """Sweep every ``sweep_interval_s`` until cancelled; a failed sweep is logged (its
        kind, never data) and tried again next time."""
        while True:
            try:
                swept = await self.sweep_once(int(time.time()))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store may be away: try again next interval
                log.warning("batch sweep failed: %s", type(exc).__name__)
            else:
                if swept.total:
                    log.info(
                        "batch sweep deleted %d expired files, %d batches past retention,"
                        " %d abandoned uploads",
                        swept.files,
                        swept.batches,
                        swept.uploads,
                    )
            await asyncio.sleep(self.spec.sweep_interval_s)
