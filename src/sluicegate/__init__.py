"""sluicegate: admission control and scheduling for OpenAI-compatible LLM engines."""

from __future__ import annotations

__version__ = "0.1.0"
