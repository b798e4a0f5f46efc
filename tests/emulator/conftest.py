"""Fixtures: emulators served by a real uvicorn on loopback (see ``emulator_harness``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import openai
import pytest

from sluicegate.engine import EngineConfig, preset
from tests.emulator.emulator_harness import LiveEmulator, run_emulator


@pytest.fixture
def tiny() -> EngineConfig:
    """The ``tiny`` engine preset (~2 ms steps)."""
    return preset("tiny")


@pytest.fixture
def emulator(tiny: EngineConfig) -> Iterator[LiveEmulator]:
    """An emulator of the ``tiny`` preset, fresh for each test."""
    with run_emulator(tiny) as live:
        yield live


@pytest.fixture
def client(emulator: LiveEmulator) -> Iterator[openai.OpenAI]:
    """An SDK client for ``emulator``, closed after the test (30 s per call: ``n`` choices
    of a long answer take a while on a loaded machine)."""
    with openai.OpenAI(
        base_url=f"{emulator.base_url}/v1", api_key="x", max_retries=0, timeout=30
    ) as sdk:
        yield sdk


@pytest.fixture
def start_emulator() -> Callable[..., AbstractContextManager[LiveEmulator]]:
    """A factory for emulators of other engine configs."""
    return run_emulator
