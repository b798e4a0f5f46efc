"""Output lengths: how many tokens a modelled request generates.

The draw is a pure function of ``(seed, req_id, prompt_tokens)``, not of call
order, so the same request gets the same length in every run, on every engine
replica, and in a simulator's ``oracle`` policy that asks for it ahead of time.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

_TWO_POW_64 = float(2**64)


@dataclass(frozen=True, slots=True)
class OutputLengthModel:
    """Lognormal output length whose median grows weakly with the prompt.

    ``median(p) = median_tokens · (max(p, 1) / reference_prompt_tokens) ** prompt_exponent``
    and ``length = median(p) · exp(sigma · z)`` with ``z ~ N(0, 1)``, rounded and
    clamped to ``[1, max_tokens]``.

    Defaults are an assumption, not a fit: they give a mean of ~180 tokens for a
    200-token prompt (``110 · e^{1/2} ≈ 181``), matching the ShareGPT sample of
    vLLM's v0.6.0 benchmark (average input 202, output 179 tokens;
    blog.vllm.ai/2024/09/05/perf-update.html), with a heavy right tail
    (sigma = 1) and a mild prompt dependence (exponent 0.1).

    Attributes:
        median_tokens: median output length at the reference prompt length.
        sigma: standard deviation of ``ln(length)``.
        prompt_exponent: elasticity of the median to the prompt length.
        reference_prompt_tokens: prompt length at which the median is ``median_tokens``.
    """

    median_tokens: float = 110.0
    sigma: float = 1.0
    prompt_exponent: float = 0.1
    reference_prompt_tokens: float = 200.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median_tokens) and self.median_tokens >= 1.0):
            raise ValueError(f"median_tokens must be >= 1, got {self.median_tokens!r}")
        if not (math.isfinite(self.sigma) and 0.0 <= self.sigma <= 5.0):
            raise ValueError(f"sigma must be in [0, 5], got {self.sigma!r}")
        if not (math.isfinite(self.prompt_exponent) and -1.0 <= self.prompt_exponent <= 1.0):
            raise ValueError(f"prompt_exponent must be in [-1, 1], got {self.prompt_exponent!r}")
        if not (math.isfinite(self.reference_prompt_tokens) and self.reference_prompt_tokens > 0):
            raise ValueError(
                f"reference_prompt_tokens must be > 0, got {self.reference_prompt_tokens!r}"
            )

    def median_for(self, prompt_tokens: int) -> float:
        """Median output length for a prompt of this size."""
        ratio = max(prompt_tokens, 1) / self.reference_prompt_tokens
        return self.median_tokens * math.pow(ratio, self.prompt_exponent)

    def length(self, z: float, prompt_tokens: int) -> float:
        """The length for a standard-normal deviate ``z``, before rounding and capping."""
        return self.median_for(prompt_tokens) * math.exp(self.sigma * z)


DEFAULT_LENGTH_MODEL = OutputLengthModel()


def request_normal(seed: int, req_id: str, prompt_tokens: int) -> float:
    """A standard-normal deviate determined by the seed and the request.

    Two uniforms ``u1, u2`` in (0, 1) come from a 128-bit BLAKE2b digest of the
    key (not ``hash()``, which Python salts per process); Box–Muller gives
    ``z = sqrt(−2 ln u1) · cos(2π u2)``.
    """
    key = f"{seed}\x1f{req_id}\x1f{prompt_tokens}".encode()
    digest = hashlib.blake2b(key, digest_size=16).digest()
    u1 = (int.from_bytes(digest[:8], "big") + 0.5) / _TWO_POW_64
    u2 = (int.from_bytes(digest[8:], "big") + 0.5) / _TWO_POW_64
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def draw_output_tokens(
    seed: int,
    req_id: str,
    prompt_tokens: int,
    max_tokens: int,
    model: OutputLengthModel = DEFAULT_LENGTH_MODEL,
) -> int:
    """The seeded output length of a request that stops at its own EOS.

    Returns:
        ``round(model.length(z, prompt_tokens))`` clamped to ``[1, max_tokens]``,
        with ``z = request_normal(seed, req_id, prompt_tokens)``.
    """
    length = model.length(request_normal(seed, req_id, prompt_tokens), prompt_tokens)
    return max(1, min(max_tokens, round(length)))


def resolve_output_tokens(
    seed: int,
    req_id: str,
    prompt_tokens: int,
    max_tokens: int,
    *,
    output_tokens: int | None = None,
    ignore_eos: bool = False,
    model: OutputLengthModel = DEFAULT_LENGTH_MODEL,
) -> int:
    """How many tokens the request will generate, as the engine decides it.

    ``max_tokens`` when ``ignore_eos`` (as vLLM's benchmark runs); else the
    given ``output_tokens`` (trace replay) capped to ``[1, max_tokens]``; else
    the seeded draw. An engine emits at least one token, as vLLM does.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if ignore_eos:
        return max_tokens
    if output_tokens is not None:
        return max(1, min(max_tokens, output_tokens))
    return draw_output_tokens(seed, req_id, prompt_tokens, max_tokens, model)
