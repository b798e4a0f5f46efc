"""Deterministic fake completion text: one short ASCII word per emitted token."""

from __future__ import annotations

import hashlib
import random

# Short, common, ASCII-only words so that one token is one word and one SSE chunk.
_WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "is", "it", "that", "for", "on", "as", "with",
    "was", "by", "at", "from", "this", "we", "an", "be", "or", "are", "can", "will",
    "model", "token", "batch", "queue", "cache", "step", "load", "time", "fast", "slow",
    "data", "run", "gate", "flow", "lane", "next", "word", "text", "line", "test",
    "good", "new", "one", "two", "all", "more", "some", "each", "then", "so", "if",
    "not", "but", "out", "up", "use", "way", "may", "how", "our",
)  # fmt: skip


class FakeText:
    """The token texts of one request: ``" " + word`` per token, reproducible per id.

    The word sequence is drawn from a ``random.Random`` seeded with a BLAKE2b
    digest of ``(seed, req_id)`` (not ``hash()``, which Python salts per
    process), so the same request id gives the same text in every run.

    Args:
        req_id: the request's id.
        seed: the emulator's seed, mixed into the digest.
    """

    __slots__ = ("_rng",)

    def __init__(self, req_id: str, seed: int = 0) -> None:
        digest = hashlib.blake2b(f"{seed}\x1f{req_id}".encode(), digest_size=8).digest()
        self._rng = random.Random(int.from_bytes(digest, "big"))

    def next_token(self) -> str:
        """The text of the request's next token: a space and one word."""
        return " " + _WORDS[self._rng.randrange(len(_WORDS))]
