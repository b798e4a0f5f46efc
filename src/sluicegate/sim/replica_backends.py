"""The simulator's backends: a model's configured backends replaced by N engine replicas,
and the engine each replica runs."""

from __future__ import annotations

import dataclasses

from sluicegate.core.spec import BackendSpec, SchedulerSpec
from sluicegate.engine.engine_config import EngineConfig

__all__ = ["engine_of", "with_replicas"]


def with_replicas(spec: SchedulerSpec, model: str, replicas: int) -> SchedulerSpec:
    """A copy of ``spec`` whose ``model`` has backends ``r0 … r{replicas−1}``.

    Each replica inherits ``max_concurrency`` and ``weight`` from the model's
    first configured backend, if it has one; otherwise the scheduler's model
    and lane caps alone bound what runs.

    Raises:
        KeyError: ``model`` is not configured.
        ValueError: ``replicas`` < 1.
    """
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    names = [m.name for m in spec.models]
    if model not in names:
        raise KeyError(f"unknown model {model!r}; configured: {names}")
    models = []
    for m in spec.models:
        if m.name == model:
            template = m.backends[0] if m.backends else BackendSpec(name="r0")
            backends = tuple(
                template.model_copy(update={"name": f"r{i}", "url": None}) for i in range(replicas)
            )
            m = m.model_copy(update={"backends": backends})
        models.append(m)
    return spec.model_copy(update={"models": tuple(models)})


def engine_of(backend: BackendSpec, engine: EngineConfig) -> EngineConfig:
    """The engine a backend runs: ``engine``, with the priority policy under passthrough.

    Raises:
        ValueError: passthrough on an engine of independent servers (FCFS by definition).
    """
    if not backend.priority_passthrough:
        return engine
    return dataclasses.replace(engine, scheduling_policy="priority")
