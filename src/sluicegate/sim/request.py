"""``WorkloadRequest``, which lives in ``sluicegate.outcomes`` (below both ``sim`` and ``bench``).

Re-exported here for callers outside ``sim`` that still import it from this module.
"""

from __future__ import annotations

from sluicegate.outcomes.request import WorkloadRequest

__all__ = ["WorkloadRequest"]
