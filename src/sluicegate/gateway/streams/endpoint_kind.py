"""The three OpenAI inference endpoints the gateway serves: their kind and their path."""

from __future__ import annotations

from typing import Literal

Endpoint = Literal["chat", "completions", "embeddings"]
"""Which inference endpoint a request is for; it decides the body's and the answer's shape."""

PATHS: dict[Endpoint, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}
"""Each endpoint's path."""
