"""vLLM's KV event wire format: encode and decode agree, both event encodings decode, and
anything malformed or over a bound raises ``KvWireError``."""

from __future__ import annotations

import msgpack  # type: ignore[import-untyped]  # ships no type hints
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.kv_index import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from sluicegate.engine_profiles.kv_events_wire import (
    MAX_ITEMS,
    MAX_PAYLOAD_BYTES,
    REPLAY_END,
    KvWireError,
    decode_batch,
    encode_batch,
    is_replay_end,
    message_frames,
    pack_seq,
    split_message,
    unpack_seq,
)

hashes = st.lists(st.integers(0, 2**64 - 1), max_size=8).map(tuple)
events = st.one_of(
    st.builds(BlockStored, hashes, st.none() | st.integers(0, 2**64 - 1)),
    st.builds(BlockRemoved, hashes),
    st.just(AllBlocksCleared()),
)


@given(
    ts=st.floats(allow_nan=False, allow_infinity=False),
    batch=st.lists(events, max_size=6),
    dp_rank=st.none() | st.integers(0, 7),
    encoding=st.sampled_from(["map", "array"]),
)
def test_round_trip(ts: float, batch: list[KvEvent], dp_rank: int | None, encoding: str) -> None:
    """Whatever is encoded, in either encoding, decodes to the same timestamp and events."""
    payload = encode_batch(ts, batch, dp_rank, encoding=encoding)  # type: ignore[arg-type]
    assert decode_batch(payload) == (ts, batch)


@given(st.integers(0, 2**63 - 1))
def test_seq_round_trip(seq: int) -> None:
    """A sequence number survives its 8-byte frame."""
    assert len(pack_seq(seq)) == 8
    assert unpack_seq(pack_seq(seq)) == seq


def test_vllm_positional_batch_decodes() -> None:
    """A batch as vLLM 0.10-0.23 sends it (positional events, token ids, lora id, medium)."""
    payload = msgpack.packb(
        [
            1.5,
            [
                ["BlockStored", [1, 2], None, list(range(32)), 16, None, "GPU"],
                ["BlockStored", [3], 2, list(range(16)), 16, None],
                ["BlockRemoved", [1], "GPU"],
                ["BlockRemoved", [2]],
                ["AllBlocksCleared"],
            ],
            0,
        ]
    )
    assert decode_batch(payload) == (
        1.5,
        [
            BlockStored((1, 2), None),
            BlockStored((3,), 2),
            BlockRemoved((1,)),
            BlockRemoved((2,)),
            AllBlocksCleared(),
        ],
    )


def test_vllm_map_batch_decodes_with_extra_fields_and_byte_hashes() -> None:
    """Map events (vLLM after #42892) with fields this decoder does not know decode; bytes
    hashes are big-endian ints; a CPU-tier event is skipped."""
    stored = {
        "type": "BlockStored",
        "block_hashes": [b"\x01\x00", 7],
        "parent_block_hash": b"\x05",
        "token_ids": [1, 2],
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None, None],
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    offloaded = {"type": "BlockStored", "block_hashes": [9], "medium": "CPU"}
    payload = msgpack.packb([2.0, [stored, offloaded], 0], use_bin_type=True)
    assert decode_batch(payload) == (2.0, [BlockStored((256, 7), 5)])


def test_frames() -> None:
    """A PUB message is split back into topic, sequence and payload; the replay end marker
    is vLLM's signed -1."""
    assert split_message(message_frames(b"kv", 5, b"p")) == (b"kv", 5, b"p")
    assert REPLAY_END == b"\xff" * 8
    assert is_replay_end(REPLAY_END, b"")
    assert not is_replay_end(pack_seq(3), b"x")


@pytest.mark.parametrize(
    "frames", [[b"kv", b"x"], [b"kv", b"\x00" * 7, b"p"], [b"a", b"b", b"c", b"d"]]
)
def test_bad_frames_refused(frames: list[bytes]) -> None:
    """Wrong frame counts and short sequence frames raise ``KvWireError``."""
    with pytest.raises(KvWireError):
        split_message(frames)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # never used in msgpack
        b"\x92\x01",  # truncated
        msgpack.packb({"ts": 1.0}),
        msgpack.packb([1.0]),
        msgpack.packb([True, []]),
        msgpack.packb(["x", []]),
        msgpack.packb([1.0, {}]),
        msgpack.packb([1.0, [], "rank"]),
        msgpack.packb([1.0, [5]]),
        msgpack.packb([1.0, [[7, [1]]]]),
        msgpack.packb([1.0, [["BlockStored", [1]]]]),
        msgpack.packb([1.0, [["BlockRemoved"]]]),
        msgpack.packb([1.0, [["BlockRemoved", "notalist"]]]),
        msgpack.packb([1.0, [["BlockRemoved", [1.5]]]]),
        msgpack.packb([1.0, [["BlockRemoved", [True]]]]),
        msgpack.packb([1.0, [["BlockRemoved", [b""]]]], use_bin_type=True),
        msgpack.packb([1.0, [["BlockRemoved", [b"x" * 65]]]], use_bin_type=True),
        msgpack.packb([1.0, [{"type": "BlockStored"}]]),
        msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [1], "medium": 3}]]),
        msgpack.packb([1.0, [{1: 2}]]),
        msgpack.packb([1.0, []]) + b"\x00",  # trailing data
        b"\xdd\xff\xff\xff\xff",  # an array header claiming 2**32 - 1 items
        b"\x92\x01\xdd\x7f\xff\xff\xff",  # events claiming 2**31 - 1 items
        b"\x91" * 5000 + b"\x90",  # nesting deeper than msgpack's stack
    ],
)
def test_malformed_refused(payload: bytes) -> None:
    """Every malformed payload raises ``KvWireError``, a ``ValueError``."""
    with pytest.raises(KvWireError):
        decode_batch(payload)
    assert issubclass(KvWireError, ValueError)


def test_bounds() -> None:
    """Over ``MAX_PAYLOAD_BYTES`` is refused unread; an array over ``MAX_ITEMS`` too."""
    with pytest.raises(KvWireError, match="over"):
        decode_batch(b"\x00" * (MAX_PAYLOAD_BYTES + 1))
    too_long = msgpack.packb([1.0, [["BlockRemoved", [0] * (MAX_ITEMS + 1)]]])
    assert len(too_long) <= MAX_PAYLOAD_BYTES
    with pytest.raises(KvWireError):
        decode_batch(too_long)
    at_bound = msgpack.packb([1.0, [["BlockRemoved", [0] * MAX_ITEMS]]])
    assert decode_batch(at_bound)[1] == [BlockRemoved((0,) * MAX_ITEMS)]


def test_an_event_of_a_kind_it_does_not_read_is_skipped() -> None:
    """A newer engine's kind (a string this reader does not know) is skipped, the batch's
    other events kept: one new kind must not cost the whole index."""
    payload = msgpack.packb(
        [1.0, [["BlockUpdated", [1]], {"type": "BlockRemoved", "block_hashes": [2]}]]
    )
    assert decode_batch(payload) == (1.0, [BlockRemoved((2,))])
