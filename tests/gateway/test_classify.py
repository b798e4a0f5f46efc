"""``classify.parse_body`` and ``classify.classify``: what scheduling reads from a request."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.spec import LaneSpec, ModelSpec, TenantSpec
from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.request.classify import (
    MAX_ITEMS,
    MAX_TOKENS_LIMIT,
    MESSAGE_OVERHEAD_TOKENS,
    PREFIX_CHARS,
    classify,
    estimate_prompt_tokens,
    parse_body,
)

MODEL = ModelSpec(name="m", lanes=(LaneSpec(name="interactive"), LaneSpec(name="batch")))
OPEN = TenantSpec(name="open")
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def _raw(body: object) -> bytes:
    return orjson.dumps(body)


def _refusal(raw: bytes, endpoint: str = "chat") -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse_body(raw, endpoint)  # type: ignore[arg-type]
    return caught.value


def _classify(
    tenant: TenantSpec = OPEN,
    *,
    lane: str | None = None,
    priority: str | None = None,
    deadline: str | None = None,
    body_priority: int | None = None,
    model: ModelSpec = MODEL,
) -> tuple[str, int, float | None]:
    kind = classify(
        model, tenant, lane_header=lane, priority_header=priority,
        deadline_header=deadline, body_priority=body_priority,
    )  # fmt: skip
    return kind.lane, kind.priority, kind.deadline_ms


# ---------------------------------------------------------------- parse_body


def test_chat_body_yields_model_stream_and_prompt_size() -> None:
    """A chat body gives its model, stream flag, characters and message count."""
    body = {**CHAT, "messages": [{"role": "system", "content": "be brief"}, *CHAT["messages"]]}
    parsed = parse_body(_raw({**body, "stream": True, "max_tokens": 7}), "chat")
    assert (parsed.model, parsed.stream, parsed.max_tokens, parsed.n) == ("m", True, 7, 1)
    assert (parsed.prompt_chars, parsed.messages) == (len("be brief") + len("hello"), 2)


def test_chat_text_parts_count_their_text() -> None:
    """List content counts the text of its parts (non-text parts add nothing)."""
    parts = [{"type": "text", "text": "abc"}, {"type": "image_url", "image_url": {"url": "u"}}]
    parsed = parse_body(
        _raw({"model": "m", "messages": [{"role": "user", "content": parts}]}), "chat"
    )
    assert parsed.prompt_chars == 3


def test_max_completion_tokens_takes_precedence_over_max_tokens() -> None:
    """``max_completion_tokens`` (the newer name) wins when both are given."""
    parsed = parse_body(_raw({**CHAT, "max_tokens": 50, "max_completion_tokens": 9}), "chat")
    assert parsed.max_tokens == 9


def test_missing_max_tokens_is_none() -> None:
    """Without a max_tokens field the parsed value is None (the server default applies)."""
    assert parse_body(_raw(CHAT), "chat").max_tokens is None


@pytest.mark.parametrize("value", ["10", -1, 0, 1.5, True, [3], 1e30, MAX_TOKENS_LIMIT + 1])
def test_bad_max_tokens_is_refused_naming_it(value: object) -> None:
    """max_tokens that is not a positive integer is a 400 whose param is ``max_tokens``."""
    error = _refusal(_raw({**CHAT, "max_tokens": value}))
    assert (error.status, error.param) == (400, "max_tokens")


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens", "n", "stream"])
def test_null_means_the_field_was_not_given(field: str) -> None:
    """``null`` for an optional field the gateway reads is the same as leaving it out."""
    assert parse_body(_raw({**CHAT, field: None}), "chat") == parse_body(_raw(CHAT), "chat")


@pytest.mark.parametrize("value", [0, 17, "2", 10**6])
def test_bad_n_is_refused_naming_it(value: object) -> None:
    """``n`` outside [1, 16] or not an integer is a 400 naming ``n``."""
    assert _refusal(_raw({**CHAT, "n": value})).param == "n"


@pytest.mark.parametrize("value", [-1, 6, "1"])
def test_bad_body_priority_is_refused_naming_it(value: object) -> None:
    """A body ``priority`` outside [0, 5] or not an integer is a 400 naming ``priority``."""
    assert _refusal(_raw({**CHAT, "priority": value})).param == "priority"


@pytest.mark.parametrize(
    ("raw", "code"),
    [(b"{", "invalid_json"), (b"[1, 2]", "invalid_json"), (b'"text"', "invalid_json")],
)
def test_non_object_bodies_are_refused(raw: bytes, code: str) -> None:
    """Invalid JSON, or JSON that is not an object, is a 400 ``invalid_json``."""
    error = _refusal(raw)
    assert (error.status, error.code) == (400, code)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": CHAT["messages"]}, "model"),
        ({**CHAT, "model": ""}, "model"),
        ({**CHAT, "stream": "yes"}, "stream"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": ["hi"]}, "messages[0]"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ],
)
def test_malformed_fields_are_refused_naming_them(body: dict[str, object], param: str) -> None:
    """A field scheduling reads that has the wrong type is a 400 naming that field."""
    assert _refusal(_raw(body)).param == param


def test_embeddings_cannot_stream() -> None:
    """``stream: true`` on embeddings is a 400 naming ``stream``."""
    error = _refusal(_raw({"model": "m", "input": "x", "stream": True}), "embeddings")
    assert error.param == "stream"


@pytest.mark.parametrize(
    ("prompt", "chars"),
    [("abcdef", 6), (["ab", "cde"], 5), ([1, 2, 3], 12), ([[1, 2], [3]], 12)],
)
def test_completion_prompt_sizes(prompt: object, chars: int) -> None:
    """A prompt string counts its characters, a list of strings their sum, token ids 4 each."""
    assert parse_body(_raw({"model": "m", "prompt": prompt}), "completions").prompt_chars == chars


@pytest.mark.parametrize("prompt", [None, [], 5, [1, "a"]])
def test_bad_completion_prompt_is_refused(prompt: object) -> None:
    """A missing, empty or mixed prompt is a 400 naming ``prompt``."""
    assert _refusal(_raw({"model": "m", "prompt": prompt}), "completions").param == "prompt"


def _part() -> dict[str, str]:
    return {"type": "text", "text": "x"}


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        ("chat", {"model": "m", "messages": [{"role": "user"}] * (MAX_ITEMS + 1)}, "messages"),
        ("chat", {"model": "m", "messages": [{"content": [_part()] * (MAX_ITEMS + 1)}]},
         "messages[0].content"),
        ("chat", {"model": "m", "messages": [{"content": [_part()] * 64}] * (MAX_ITEMS // 64 + 1)},
         "messages"),
        ("completions", {"model": "m", "prompt": ["x"] * (MAX_ITEMS + 1)}, "prompt"),
        ("completions", {"model": "m", "prompt": [[1]] * (MAX_ITEMS + 1)}, "prompt"),
        ("embeddings", {"model": "m", "input": ["x"] * (MAX_ITEMS + 1)}, "input"),
    ],
)  # fmt: skip
def test_arrays_past_max_items_are_refused(
    endpoint: str, body: dict[str, object], param: str
) -> None:
    """Messages, content parts (per message and in all) and prompt entries past
    ``MAX_ITEMS`` are a 400 ``array_above_max_length`` naming the array."""
    error = _refusal(_raw(body), endpoint)
    assert (error.status, error.code, error.param) == (400, "array_above_max_length", param)


def test_arrays_at_max_items_pass() -> None:
    """Exactly ``MAX_ITEMS`` messages, and any number of token ids, are accepted."""
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}] * MAX_ITEMS}
    assert parse_body(_raw(chat), "chat").messages == MAX_ITEMS
    ids = {"model": "m", "prompt": [1] * (4 * MAX_ITEMS)}
    assert parse_body(_raw(ids), "completions").prompt_chars == 16 * MAX_ITEMS


def test_prefix_is_the_leading_text_of_the_first_message() -> None:
    """The routing prefix is at most PREFIX_CHARS characters of the first message's text."""
    long = "s" * (PREFIX_CHARS + 50)
    body = {"model": "m", "messages": [{"role": "system", "content": long}, CHAT["messages"][0]]}
    assert parse_body(_raw(body), "chat").prefix == "s" * PREFIX_CHARS


@settings(deadline=None)
@given(chars=st.integers(0, 10_000), messages=st.integers(1, 20), per=st.floats(0.5, 8.0))
def test_prompt_estimate_is_chars_over_ratio_plus_message_overhead(
    chars: int, messages: int, per: float
) -> None:
    """Estimated prompt tokens = ceil(chars / chars_per_token) + 4 per chat message."""
    content = [{"role": "user", "content": ""} for _ in range(messages)]
    content[0]["content"] = "x" * chars
    parsed = parse_body(_raw({"model": "m", "messages": content}), "chat")
    expected = math.ceil(chars / per) + MESSAGE_OVERHEAD_TOKENS * messages
    assert estimate_prompt_tokens(parsed, per) == expected


# ---------------------------------------------------------------- classify


def test_no_lane_header_uses_the_tenants_default_lane() -> None:
    """Without X-Sluicegate-Lane the lane is the tenant's ``default_lane``."""
    assert _classify(TenantSpec(name="t", default_lane="batch"))[0] == "batch"


def test_default_lane_the_model_lacks_falls_back_to_its_first_lane() -> None:
    """If the tenant's default lane is not one of this model's, the model's first lane."""
    model = ModelSpec(name="m2", lanes=(LaneSpec(name="bulk"), LaneSpec(name="fast")))
    assert _classify(OPEN, model=model)[0] == "bulk"


def test_lane_header_selects_an_allowed_lane() -> None:
    """A lane header naming a lane the tenant may use selects it."""
    tenant = TenantSpec(name="t", allowed_lanes=("interactive", "batch"))
    assert _classify(tenant, lane="batch")[0] == "batch"


def test_lane_header_outside_allowed_lanes_is_403() -> None:
    """A lane the tenant may not use is refused with 403 ``lane_not_allowed``."""
    with pytest.raises(GatewayError) as caught:
        _classify(TenantSpec(name="t", allowed_lanes=("interactive",)), lane="batch")
    assert (caught.value.status, caught.value.code) == (403, "lane_not_allowed")


def test_unknown_lane_header_is_400() -> None:
    """A lane the model does not have is 400 ``invalid_lane``, even for an open tenant."""
    with pytest.raises(GatewayError) as caught:
        _classify(lane="express")
    assert (caught.value.status, caught.value.code) == (400, "invalid_lane")


def test_priority_defaults_to_the_tenants_default() -> None:
    """With neither header nor body priority the tenant's ``default_priority`` applies."""
    assert _classify(TenantSpec(name="t", default_priority=4))[1] == 4


def test_priority_header_overrides_the_body() -> None:
    """X-Sluicegate-Priority wins over the body's ``priority``."""
    assert _classify(priority="3", body_priority=1)[1] == 3


@settings(deadline=None)
@given(asked=st.integers(0, 5), cap=st.integers(0, 5), by_header=st.booleans())
def test_priority_is_capped_at_the_tenants_max_priority(
    asked: int, cap: int, by_header: bool
) -> None:
    """A priority more important (lower) than the tenant's ``max_priority`` is lowered to it;
    one at or below it is kept: result = max(asked, max_priority)."""
    tenant = TenantSpec(name="t", max_priority=cap)
    header, body = (str(asked), None) if by_header else (None, asked)
    assert _classify(tenant, priority=header, body_priority=body)[1] == max(asked, cap)


@pytest.mark.parametrize("header", ["-1", "6", "high", "1.5", " 2", "02", "\xb2", "0" * 5000])
def test_bad_priority_header_is_400(header: str) -> None:
    """A priority header that is not one digit 0-5 is 400 ``invalid_priority`` ("²", a
    Latin-1 header byte, passes ``str.isdigit`` but not ``int``: it once raised)."""
    with pytest.raises(GatewayError) as caught:
        _classify(priority=header)
    assert (caught.value.status, caught.value.code) == (400, "invalid_priority")


@pytest.mark.parametrize(("header", "ms"), [("250", 250.0), ("1.5", 1.5), ("1e3", 1000.0)])
def test_deadline_header_is_parsed_in_milliseconds(header: str, ms: float) -> None:
    """X-Sluicegate-Deadline-Ms is a positive number of milliseconds."""
    assert _classify(deadline=header)[2] == ms


def test_no_deadline_header_leaves_it_to_the_lane() -> None:
    """Without the header no deadline is set here (the scheduler uses the lane's SLO)."""
    assert _classify()[2] is None


@pytest.mark.parametrize("header", ["0", "-5", "soon", "inf", "nan", "1e400"])
def test_bad_deadline_header_is_400(header: str) -> None:
    """A deadline that is not a finite positive number is 400 ``invalid_deadline``."""
    with pytest.raises(GatewayError) as caught:
        _classify(deadline=header)
    assert (caught.value.status, caught.value.code) == (400, "invalid_deadline")
