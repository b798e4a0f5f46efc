"""``POST /v1/embeddings`` for the emulator: what it reads and what it answers.

Each input (a string, a list of strings, token ids, or a list of token-id lists,
as OpenAI accepts) runs in the engine as a prefill-only request (one token out,
which the answer does not include), so embedding traffic loads the emulated
engine as vLLM's pooling runs do. The vectors are unit-length and a pure
function of the input, so the same input always embeds the same.
"""

from __future__ import annotations

import hashlib
import math
import struct

import orjson

from sluicegate.emulator.openai_wire import CHARS_PER_TOKEN, ApiError, parse_body

DIMENSIONS = 16
"""Length of a vector unless the request asks for ``dimensions``."""
MAX_DIMENSIONS = 4096
MAX_INPUTS = 2048


def _invalid(message: str, param: str | None) -> ApiError:
    return ApiError(400, message, "invalid_request", param)


def _token_ids(value: object) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def parse_embeddings(raw: bytes, model: str) -> tuple[list[tuple[bytes, int]], int]:
    """The inputs of an embeddings body, each as (what it embeds, its prompt tokens), and
    the vector length.

    Raises:
        ApiError: 400 for bad JSON or an input of the wrong shape; 404 for another model.
    """
    body = parse_body(raw, model)
    dims = body.get("dimensions", DIMENSIONS)
    if not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= MAX_DIMENSIONS:
        raise _invalid(f"'dimensions' must be an integer from 1 to {MAX_DIMENSIONS}", "dimensions")
    given = body.get("input")
    if isinstance(given, str) or _token_ids(given):
        items: list[object] = [given]
    elif isinstance(given, list) and given and len(given) <= MAX_INPUTS:
        items = list(given)
    else:
        raise _invalid(
            f"'input' must be a string, token ids, or a list of 1 to {MAX_INPUTS} of them",
            "input",
        )
    inputs: list[tuple[bytes, int]] = []
    for item in items:
        if isinstance(item, str) and item:
            inputs.append((item.encode(), max(1, math.ceil(len(item) / CHARS_PER_TOKEN))))
        elif _token_ids(item):
            assert isinstance(item, list)
            inputs.append((orjson.dumps(item), len(item)))
        else:
            raise _invalid("each input must be a non-empty string or token ids", "input")
    return inputs, dims


def vector(key: bytes, dims: int) -> list[float]:
    """A unit vector of ``dims`` numbers determined by ``key``."""
    raw = b""
    counter = 0
    while len(raw) < 4 * dims:
        raw += hashlib.blake2b(key, digest_size=64, salt=struct.pack("<Q", counter)[:8]).digest()
        counter += 1
    values = [
        (value / 0xFFFFFFFF) * 2.0 - 1.0 for value in struct.unpack(f"<{dims}I", raw[: 4 * dims])
    ]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def embeddings_body(model: str, keys: list[bytes], dims: int, prompt_tokens: int) -> bytes:
    """The OpenAI ``list`` of embeddings, with usage."""
    return orjson.dumps(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": vector(key, dims)}
                for i, key in enumerate(keys)
            ],
            "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }
    )
