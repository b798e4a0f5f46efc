"""Where the gateway is not yet correct against llama-cpp-python: one strict ``xfail`` marker
per gap, so each test that shows a gap names it, and fixing a gap turns its tests into
unexpected passes that point here.

When a gap is fixed, delete its marker here and its uses.
"""

from __future__ import annotations

import pytest

STREAM_PROMPT_TOKENS = pytest.mark.xfail(
    strict=True,
    reason=(
        "gap: llama.cpp streams carry no usage, so the prompt tokens of a streamed request "
        "(and of every non-streamed one: the gateway streams them upstream so that a client "
        "that leaves stops the engine) come from the chars/per-token estimate, in the "
        "gateway's accounting and in the usage it reports"
    ),
)
CUT_SHORT_STREAM = pytest.mark.xfail(
    strict=True,
    reason=(
        "gap: a llama.cpp stream cut short by interrupt_requests ends with [DONE] and no "
        "finish_reason; the gateway relays it as a complete answer instead of an error event"
    ),
)
