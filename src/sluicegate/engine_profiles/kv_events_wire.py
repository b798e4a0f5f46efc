"""vLLM's KV cache events on the wire: a ``KVEventBatch`` as msgpack, and its ZMQ frames
(sans-I/O: bytes in, events out, and back).

The format is vLLM's (``vllm/distributed/kv_events.py``: ``KVEventBatch``,
``ZmqEventPublisher``; ``examples/online_serving/kv_events_subscriber.py``); SGLang
publishes the same kinds. A batch is the positional array ``[ts, events]`` or
``[ts, events, data_parallel_rank]``. Each event is either a positional array (vLLM up to
0.23, msgspec ``array_like=True``)::

    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium?, ...]
    ["BlockRemoved", block_hashes, medium?, ...]
    ["AllBlocksCleared"]

or, since vLLM's PR #42892 (and SGLang's #37271), a map of named fields with the kind
under ``"type"`` (``{"type": "BlockStored", "block_hashes": [...], ...}``). Both decode;
fields past the ones read here are ignored. Block hashes are ints (64-bit in vLLM's
default) or bytes (``ExternalBlockHash``): bytes are read as one big-endian unsigned int.
Events whose ``medium`` names a tier other than ``"GPU"`` (a CPU offload store) are
skipped: the index is of what the engine can reuse without a transfer.

Frames: the PUB socket sends ``[topic, seq, payload]`` with ``seq`` an 8-byte big-endian
counter from 0. A subscriber that sees a gap sends the first missing ``seq`` (8 bytes) to
the ROUTER replay socket through a DEALER (``["", seq]``), and gets back ``["", seq,
payload]`` for each buffered batch from there, then ``["", REPLAY_END, b""]``.

Decoding is bounded: a payload over ``MAX_PAYLOAD_BYTES`` is refused unread, and msgpack
refuses any array, map, string or binary longer than the limits below before allocating
it, so a hostile payload costs at most a few times its own size. Anything malformed raises
``KvWireError`` (a ``ValueError``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypeGuard

import msgpack  # type: ignore[import-untyped]  # ships no type hints

from sluicegate.core.kv_index import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from sluicegate.errors import SluicegateError

MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
"""The largest batch decoded; a vLLM step's batch is tens of kilobytes (the token ids of
at most ``max_num_batched_tokens`` prompt tokens, 8192 by default, and a hash per block)."""
MAX_ITEMS = 1 << 20
"""The longest array in a batch (events, block hashes, token ids)."""
MAX_MAP_ITEMS = 1024
MAX_STR_BYTES = 64 * 1024
MAX_BIN_BYTES = 64 * 1024
MAX_HASH_BYTES = 64
"""The longest bytes block hash taken (vLLM's are 32-byte SHA-256 digests at most)."""

SEQ_BYTES = 8
REPLAY_END = (-1).to_bytes(SEQ_BYTES, "big", signed=True)
"""The sequence frame ending a replay (vLLM's ``ZmqEventPublisher.END_SEQ``); its payload
frame is empty."""
GPU_MEDIUM = "GPU"

EventEncoding = Literal["map", "array"]


class KvWireError(SluicegateError, ValueError):
    """A KV event message that is not vLLM's format, or is over a bound."""


def pack_seq(seq: int) -> bytes:
    """A sequence number as its 8-byte big-endian frame."""
    if not 0 <= seq < 1 << (8 * SEQ_BYTES - 1):
        raise KvWireError(f"sequence number out of range: {seq}")
    return seq.to_bytes(SEQ_BYTES, "big")


def unpack_seq(frame: bytes) -> int:
    """The sequence number an 8-byte big-endian frame carries."""
    if len(frame) != SEQ_BYTES:
        raise KvWireError(f"a sequence frame has {SEQ_BYTES} bytes, got {len(frame)}")
    return int.from_bytes(frame, "big")


def is_replay_end(seq_frame: bytes, payload: bytes) -> bool:
    """Whether a replay answer is the end marker (vLLM sends ``REPLAY_END`` and no payload)."""
    return seq_frame == REPLAY_END or not payload


def message_frames(topic: bytes, seq: int, payload: bytes) -> list[bytes]:
    """The PUB socket's multipart message for one batch."""
    return [topic, pack_seq(seq), payload]


def split_message(frames: Sequence[bytes]) -> tuple[bytes, int, bytes]:
    """``(topic, seq, payload)`` of a PUB message; ``KvWireError`` unless three frames with
    an 8-byte sequence."""
    if len(frames) != 3:
        raise KvWireError(f"a KV event message has 3 frames, got {len(frames)}")
    topic, seq, payload = frames
    return bytes(topic), unpack_seq(bytes(seq)), bytes(payload)


def encode_batch(
    ts: float,
    events: Sequence[KvEvent],
    dp_rank: int | None = 0,
    *,
    encoding: EventEncoding = "map",
    block_size: int = 16,
) -> bytes:
    """One ``KVEventBatch`` as vLLM publishes it: events as maps (vLLM since #42892) or as
    positional arrays (vLLM up to 0.23). ``token_ids`` are sent empty (sluicegate has no
    tokens) and ``block_size`` as given; ``dp_rank`` None leaves the rank out, as
    msgspec's ``omit_defaults`` does."""
    body = [_encode_event(e, encoding, block_size) for e in events]
    batch: list[Any] = [ts, body] if dp_rank is None else [ts, body, dp_rank]
    packed: bytes = msgpack.packb(batch, use_bin_type=True)
    return packed


def _encode_event(event: KvEvent, encoding: EventEncoding, block_size: int) -> Any:
    if isinstance(event, BlockStored):
        hashes, parent = list(event.hashes), event.parent
        if encoding == "array":
            return ["BlockStored", hashes, parent, [], block_size, None, GPU_MEDIUM]
        return {
            "type": "BlockStored",
            "block_hashes": hashes,
            "parent_block_hash": parent,
            "token_ids": [],
            "block_size": block_size,
            "lora_id": None,
            "medium": GPU_MEDIUM,
            "lora_name": None,
        }
    if isinstance(event, BlockRemoved):
        if encoding == "array":
            return ["BlockRemoved", list(event.hashes), GPU_MEDIUM]
        return {"type": "BlockRemoved", "block_hashes": list(event.hashes), "medium": GPU_MEDIUM}
    return ["AllBlocksCleared"] if encoding == "array" else {"type": "AllBlocksCleared"}


def decode_batch(payload: bytes) -> tuple[float, list[KvEvent]]:
    """``(ts, events)`` of one ``KVEventBatch``; ``KvWireError`` on anything malformed or
    over a bound (nothing of a bad batch is returned)."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise KvWireError(f"payload of {len(payload)} bytes, over {MAX_PAYLOAD_BYTES}")
    try:
        batch = msgpack.unpackb(
            payload,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_array_len=MAX_ITEMS,
            max_map_len=MAX_MAP_ITEMS,
            max_str_len=MAX_STR_BYTES,
            max_bin_len=MAX_BIN_BYTES,
            max_ext_len=0,
        )
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise KvWireError(f"not a msgpack value: {exc}") from exc
    if not isinstance(batch, list) or len(batch) not in (2, 3):
        raise KvWireError("a batch is [ts, events] or [ts, events, data_parallel_rank]")
    ts, events = batch[0], batch[1]
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise KvWireError(f"a batch's ts is a number, got {type(ts).__name__}")
    if not isinstance(events, list):
        raise KvWireError(f"a batch's events are an array, got {type(events).__name__}")
    if len(batch) == 3 and not (batch[2] is None or _is_int(batch[2])):
        raise KvWireError("a batch's data_parallel_rank is an int or nil")
    decoded = [_decode_event(e) for e in events]
    return float(ts), [e for e in decoded if e is not None]


def _decode_event(raw: object) -> KvEvent | None:
    if isinstance(raw, list):
        kind = raw[0] if raw else None
        fields = _positional_fields(kind, raw)
    elif isinstance(raw, dict):
        kind = raw.get("type")
        fields = raw
    else:
        raise KvWireError(f"an event is an array or a map, got {type(raw).__name__}")
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    if not isinstance(kind, str):
        raise KvWireError(f"an event's kind is a string, got {type(kind).__name__}")
    if kind not in ("BlockStored", "BlockRemoved"):
        return None  # a kind this reader does not use (a newer engine's): skipped
    if "block_hashes" not in fields:
        raise KvWireError(f"a {kind} event without block_hashes")
    medium = fields.get("medium")
    if medium is not None and not isinstance(medium, str):
        raise KvWireError("an event's medium is a string or nil")
    hashes = _hashes(fields["block_hashes"])
    if medium not in (None, GPU_MEDIUM):
        return None
    if kind == "BlockRemoved":
        return BlockRemoved(hashes)
    parent = fields.get("parent_block_hash")
    return BlockStored(hashes, None if parent is None else _block_hash(parent))


def _positional_fields(kind: object, raw: list[Any]) -> dict[str, Any]:
    """A positional event's fields by name (vLLM's field order)."""
    if kind == "BlockStored":
        if len(raw) < 6:
            raise KvWireError(f"a positional BlockStored has at least 6 items, got {len(raw)}")
        return {
            "block_hashes": raw[1],
            "parent_block_hash": raw[2],
            "medium": raw[6] if len(raw) > 6 else None,
        }
    if kind == "BlockRemoved":
        if len(raw) < 2:
            raise KvWireError("a positional BlockRemoved has at least 2 items")
        return {"block_hashes": raw[1], "medium": raw[2] if len(raw) > 2 else None}
    return {}


def _hashes(raw: object) -> tuple[int, ...]:
    if not isinstance(raw, list):
        raise KvWireError(f"block_hashes is an array, got {type(raw).__name__}")
    return tuple(_block_hash(h) for h in raw)


def _block_hash(raw: object) -> int:
    if _is_int(raw):
        return raw
    if isinstance(raw, bytes):
        if not 0 < len(raw) <= MAX_HASH_BYTES:
            raise KvWireError(f"a bytes block hash has 1 to {MAX_HASH_BYTES} bytes")
        return int.from_bytes(raw, "big")
    raise KvWireError(f"a block hash is an int or bytes, got {type(raw).__name__}")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
