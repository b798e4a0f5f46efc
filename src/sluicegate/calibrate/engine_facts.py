"""What a running engine says about itself: which engine it is and its capacity.

* **llama-server**: ``GET /props`` (``total_slots``; ``default_generation_settings.n_ctx``,
  the context of one slot; the KV holds ``total_slots × n_ctx``). It does not publish its
  step budget (``-b``, default 2048).
* **vLLM**: ``/metrics`` (``vllm:`` names; ``vllm:cache_config_info``'s ``block_size`` and
  ``num_gpu_blocks`` labels give the KV) and ``GET /v1/models`` (``max_model_len``). It
  publishes neither ``--max-num-seqs`` nor ``--max-num-batched-tokens``.
* **the emulator**: ``GET /emulator/stats`` answers; otherwise as vLLM (its default
  personality), so ``max_model_len`` is its KV capacity.

``detect_kind`` tells them apart for ``--engine auto``; ``read_facts`` gathers what the
kind publishes, leaving None what it does not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from sluicegate.calibrate.engine_client import EngineRequestError

_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """What the engine published (None: it does not say).

    Attributes:
        kind: ``llama-server``, ``vllm`` or ``emulator``.
        slots: sequences it runs at once.
        context_tokens: the longest a request's prompt and output may be together.
        kv_capacity_tokens: the KV cache, in tokens, over all sequences.
        block_size: tokens per KV block.
    """

    kind: str
    slots: int | None
    context_tokens: int | None
    kv_capacity_tokens: int | None
    block_size: int | None


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    try:
        async with session.get(url) as response:
            return response.status, await response.read()
    except aiohttp.ClientError as exc:
        raise EngineRequestError(f"GET {url}: {exc}") from exc


async def _json(session: aiohttp.ClientSession, url: str) -> Any:
    status, body = await _get(session, url)
    if status != 200:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


async def detect_kind(session: aiohttp.ClientSession, url: str) -> str:
    """``emulator``, ``llama-server`` or ``vllm``, from the paths only each serves.

    Raises:
        EngineRequestError: unreachable, or none of them (say ``--engine``).
    """
    if (await _get(session, url + "/emulator/stats"))[0] == 200:
        return "emulator"
    props = await _json(session, url + "/props")
    if isinstance(props, dict) and "total_slots" in props:
        return "llama-server"
    status, page = await _get(session, url + "/metrics")
    if status == 200 and b"vllm:" in page:
        return "vllm"
    raise EngineRequestError(
        f"cannot tell which engine serves {url} (no /emulator/stats, llama-server /props or "
        "vllm: metrics): pass --engine"
    )


async def read_facts(
    session: aiohttp.ClientSession, url: str, kind: str, model: str
) -> EngineFacts:
    """What an engine of ``kind`` at ``url`` publishes about its capacity."""
    if kind == "llama-server":
        props = await _json(session, url + "/props") or {}
        slots = props.get("total_slots")
        n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
        kv = slots * n_ctx if isinstance(slots, int) and isinstance(n_ctx, int) else None
        return EngineFacts(kind, slots, n_ctx, kv, None)
    models = await _json(session, url + "/v1/models") or {}
    context = next(
        (card.get("max_model_len") for card in models.get("data", []) if card.get("id") == model),
        None,
    )
    block_size = kv = None
    status, page = await _get(session, url + "/metrics")
    found = _CACHE_INFO.search(page.decode(errors="replace")) if status == 200 else None
    if found is not None:
        labels = dict(_LABEL.findall(found.group(1)))
        if labels.get("block_size", "").isdigit() and labels.get("num_gpu_blocks", "").isdigit():
            block_size = int(labels["block_size"])
            kv = block_size * int(labels["num_gpu_blocks"])
    if kv is None and kind == "emulator":
        kv = context
    return EngineFacts(kind, None, context, kv, block_size)
