"""A prompt as the chain of KV blocks an engine caches, hashed the same way everywhere.

Precise prefix routing asks, per backend, how many leading blocks of a new prompt the
engine holds; that needs the request's block hashes to equal the ones the engine
announces in its KV events. Engines hash token ids (vLLM: each full block of
``block_size`` tokens hashed with its parent's hash), so matching a real engine needs
its tokenizer, chat template, block size and hash function and seed. sluicegate has no
tokenizer: the gateway, the emulator and the simulator all take a prompt's *text*
(``prompt_text``), count ``chars_per_token`` characters as a token, cut it into full
blocks of ``block_tokens`` tokens and chain-hash them (``block_hashes``) — the same
function on both sides of the wire, so the emulator's events name the blocks the gateway
computes. Only full blocks are hashed, as engines do.
"""

from __future__ import annotations

import hashlib
from collections.abc import Container, Sequence

ROOT = 0
"""The parent of a prompt's first block."""


def prompt_text(body: dict[str, object]) -> str:
    """The text a request's prompt is made of, in order: for chat, each message's role,
    a colon and its text (string content, or the ``text`` of its text parts), one line
    each; for completions, the prompt string (the first, of a list). Anything else is
    empty (token-id prompts hash nothing)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        lines = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            role = message.get("role")
            lines.append(f"{role if isinstance(role, str) else ''}:{_content(message)}")
        return "\n".join(lines)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else ""


def _content(message: dict[str, object]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def block_hashes(
    text: str, block_tokens: int, chars_per_token: int = 4, *, limit: int | None = None
) -> tuple[int, ...]:
    """The chained 64-bit hashes of ``text``'s full blocks (at most ``limit``): block ``i``
    hashes its parent's hash and its own characters, so two prompts share their first
    ``k`` hashes iff their first ``k`` blocks are equal."""
    if block_tokens < 1 or chars_per_token < 1:
        raise ValueError("block_tokens and chars_per_token must be >= 1")
    size = block_tokens * chars_per_token
    count = len(text) // size
    if limit is not None:
        count = min(count, limit)
    hashes: list[int] = []
    parent = ROOT
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) == len(text):  # ASCII: slice the bytes, no re-encoding per block
        for i in range(count):
            parent = _chain(parent, encoded[i * size : (i + 1) * size])
            hashes.append(parent)
        return tuple(hashes)
    for i in range(count):
        parent = _chain(parent, text[i * size : (i + 1) * size].encode("utf-8", "surrogatepass"))
        hashes.append(parent)
    return tuple(hashes)


def _chain(parent: int, block: bytes) -> int:
    digest = hashlib.blake2b(parent.to_bytes(8, "big") + block, digest_size=8).digest()
    return int.from_bytes(digest, "big")


def leading_run(hashes: Sequence[int], held: Container[int]) -> int:
    """How many leading ``hashes`` are in ``held``: the blocks an engine can skip — a
    block's KV is useless without every block before it."""
    run = 0
    for block in hashes:
        if block not in held:
            break
        run += 1
    return run
