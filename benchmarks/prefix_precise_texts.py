"""The live B2B workload of ``prefix_precise.py --live`` as real prompt texts, and its twin
for the simulator with the very same block hashes.

``sim/workloads/b2b.py`` draws the arrivals, each request's customer (Zipf) and its
question and answer lengths; here each customer's context becomes a deterministic text
of ``context_tokens × 4`` characters (opening with the customer's number, so no two
customers share a block) and each question a short text of its own (opening with the
request's number, so no two questions share one). The chat body (system: the context,
user: the question) is what the live run sends; the simulated request's prompt size and
block hashes are what the emulator makes of that body (``emulator/openai_wire.py``'s
``parse_request``: characters ÷ 4, rounded up; ``core/prefix_blocks.block_hashes`` of
``prompt_text``, full blocks only), and its ring key is the one the gateway computes
from it (``gateway/request/classify.py``: CRC-32 of the first message's leading
characters), so the simulator's ``prefix_affinity`` places each customer where the live
gateway does.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import orjson

from sluicegate.core.prefix_blocks import block_hashes
from sluicegate.emulator.openai_wire import parse_request
from sluicegate.gateway.request.classify import parse_body
from sluicegate.outcomes import WorkloadRequest
from sluicegate.sim.workloads.b2b import b2b
from sluicegate.sim.workloads.synthetic import LengthDist

MODEL = "b2b"
CHARS_PER_TOKEN = 4
WORDS = (
    "invoice", "contract", "clause", "renewal", "warranty", "shipment", "ledger", "audit",
    "refund", "policy", "supplier", "quota", "region", "tariff", "escrow", "deposit",
    "account", "balance", "schedule", "appendix", "liability", "notice", "term", "party",
    "service", "level", "credit", "dispute", "delivery", "order",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class TextRequest(WorkloadRequest):
    """A B2B request with the JSON body the live run sends; ``prefix_key`` is the ring
    key the gateway computes from that body (not the simulator's default from hashes)."""

    body: bytes = b""
    ring_key: int | None = None

    @property
    def prefix_key(self) -> int | None:
        """The gateway's ``prefix_affinity`` key of ``body``."""
        return self.ring_key


def filler(seed: int, chars: int) -> str:
    """``chars`` characters of words drawn by ``seed`` (deterministic)."""
    rng = np.random.default_rng(seed)
    words: list[str] = []
    length = 0
    while length < chars:
        word = WORDS[int(rng.integers(len(WORDS)))]
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:chars]


def context(customer: int, tokens: int) -> str:
    """Customer ``customer``'s shared context: ``tokens × 4`` characters."""
    head = f"Customer {customer} handbook. "
    return head + filler(1_000_003 + customer, tokens * CHARS_PER_TOKEN - len(head))


def question_text(index: int, tokens: int) -> str:
    """Request ``index``'s question: ``tokens × 4`` characters (at least its opening)."""
    head = f"Question {index}: "
    return head + filler(index, max(0, tokens * CHARS_PER_TOKEN - len(head)))


def chat_body(context_text: str, question_text: str, max_tokens: int) -> dict[str, object]:
    """The streamed chat request: the context as system prompt, then the question."""
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": context_text},
            {"role": "user", "content": question_text},
        ],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def b2b_texts(
    rate: float,
    duration_s: float,
    *,
    seed: int,
    customers: int,
    context_tokens: int,
    question: LengthDist,
    output: LengthDist,
    block_size: int,
) -> list[TextRequest]:
    """The B2B requests (``sim/workloads/b2b.py``) with real texts, as ``TextRequest``s."""
    base = b2b(
        rate, duration_s, seed=seed, customers=customers, context_tokens=context_tokens,
        block_size=block_size, question=question, output=output,
    )  # fmt: skip
    contexts: dict[int, str] = {}
    out = []
    for index, request in enumerate(base):
        customer = int(request.tenant.removeprefix("cust"))
        if customer not in contexts:
            contexts[customer] = context(customer, context_tokens)
        asked = question_text(index, request.prompt_tokens - context_tokens)
        body = orjson.dumps(chat_body(contexts[customer], asked, request.max_tokens))
        parsed = parse_request(body, chat=True, model=MODEL)
        full = parsed.prompt_tokens // block_size
        leading = parse_body(body, "chat").prefix
        out.append(
            TextRequest(
                arrival_s=request.arrival_s,
                prompt_tokens=parsed.prompt_tokens,
                output_tokens=request.output_tokens,
                max_tokens=request.max_tokens,
                prefix=block_hashes(parsed.text, block_size, CHARS_PER_TOKEN, limit=full),
                body=body,
                ring_key=zlib.crc32(leading.encode()) if leading else None,
            )
        )
    return out
