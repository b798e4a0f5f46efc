"""``POST /v1/embeddings`` on the emulator, through the official ``openai`` SDK."""

from __future__ import annotations

import math

import openai
import pytest

from tests.emulator.emulator_harness import MODEL, LiveEmulator


def test_each_input_is_a_unit_vector_of_its_own_and_runs_in_the_engine(
    client: openai.OpenAI, emulator: LiveEmulator
) -> None:
    """Three inputs (two equal) give three unit vectors in input order, equal for equal
    inputs and different otherwise; usage counts ceil(chars / 4) per input; each input
    was one request in the engine."""
    before = emulator.stats()
    texts = ["a" * 40, "b" * 9, "a" * 40]
    reply = client.embeddings.create(model=MODEL, input=texts)
    assert [item.index for item in reply.data] == [0, 1, 2]
    vectors = [item.embedding for item in reply.data]
    assert all(len(v) == 16 for v in vectors)
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0) for v in vectors)
    assert vectors[0] == vectors[2] != vectors[1]
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == 10 + 3 + 10
    after = emulator.stats()
    assert after["admitted_total"] - before["admitted_total"] == 3
    assert after["finished_total"] - before["finished_total"] == 3


def test_dimensions_token_ids_and_the_same_vector_every_time(client: openai.OpenAI) -> None:
    """``dimensions`` sets the length; token ids count one token each; the same input
    embeds the same in a later request."""
    first = client.embeddings.create(model=MODEL, input=[[1, 2, 3, 4, 5]], dimensions=64)
    again = client.embeddings.create(model=MODEL, input=[[1, 2, 3, 4, 5]], dimensions=64)
    assert len(first.data[0].embedding) == 64
    assert first.data[0].embedding == again.data[0].embedding
    assert first.usage.prompt_tokens == 5


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": MODEL, "input": ""}, 400, "input"),
        ({"model": MODEL, "input": [1, "x"]}, 400, "input"),
        ({"model": MODEL, "input": []}, 400, "input"),
        ({"model": MODEL, "input": "x", "dimensions": 0}, 400, "dimensions"),
        ({"model": "other", "input": "x"}, 404, "model"),
        ({"model": MODEL, "input": "x" * 4_000_000}, 400, "input"),
    ],
)
def test_bad_input_is_an_openai_error(
    client: openai.OpenAI, body: dict[str, object], status: int, param: str
) -> None:
    """A malformed input, a bad ``dimensions``, another model, or an input longer than the
    engine's context is refused in OpenAI's shape, naming the parameter."""
    with pytest.raises(openai.APIStatusError) as caught:
        client.post("/embeddings", body=body, cast_to=object)
    assert caught.value.status_code == status
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == param, error
