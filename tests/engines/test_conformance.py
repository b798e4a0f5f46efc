"""The conformance suite every engine profile passes (``sluicegate.engine_profiles``), on
its recorded-format fixtures (``conformance.py`` says what they hold).

A profile that maps nothing fails: its metrics fixtures must give a running or waiting
count, and every metric name it claims to read must change some reading. The same
gateway code that serves requests reads the fixtures: the error relay
(``replies.relayed_error``), the stream scanner and the stream assembler.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.component_specs import EngineKind
from sluicegate.engine_profiles import PROFILES, EngineProfile, Reading, scan
from sluicegate.gateway.request.replies import relayed_error
from sluicegate.gateway.request.stream_errors import openai_error_events
from sluicegate.gateway.streams.assemble import StreamAssembler
from sluicegate.gateway.streams.scanner import SseScanner
from sluicegate.gateway.streams.sse import payloads_of
from tests.engines.conformance import STREAM_KINDS, expected, folder

ENGINES = sorted(PROFILES)
SCRAPED = [name for name in ENGINES if PROFILES[name].metric_names]


def _reading(fields: dict[str, Any]) -> Reading:
    return Reading(**fields)


def test_every_engine_kind_has_a_profile_and_every_profile_a_kind() -> None:
    """``engine:`` accepts exactly the engines that have a profile."""
    assert set(typing.get_args(EngineKind)) == set(PROFILES)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_profile_is_named_and_summed_up(engine: str) -> None:
    """Each profile answers to its own name and says in one line what is read."""
    profile = PROFILES[engine]
    assert profile.name == engine
    assert profile.summary
    if not profile.metric_names:
        assert profile.metrics_path is None, "a metrics path with nothing to read there"


@pytest.mark.parametrize("engine", SCRAPED)
def test_each_metrics_page_reads_as_expected(engine: str) -> None:
    """Every recorded page gives exactly the expected reading."""
    profile = PROFILES[engine]
    pages = expected(engine)["metrics"]
    assert pages, "a scraped profile needs a metrics fixture"
    for page, fields in pages.items():
        text = (folder(engine) / page).read_text()
        assert profile.read_metrics(scan(text, profile.metric_names)) == _reading(fields), page


@pytest.mark.parametrize("engine", SCRAPED)
def test_the_profile_maps_something_and_every_name_it_claims(engine: str) -> None:
    """The pages give a running or waiting count, and dropping any one claimed metric name
    from every page changes the reading of at least one page (no name is claimed idly)."""
    profile = PROFILES[engine]
    texts = [(folder(engine) / page).read_text() for page in expected(engine)["metrics"]]
    readings = [profile.read_metrics(scan(text, profile.metric_names)) for text in texts]
    assert any(r.running is not None or r.waiting is not None for r in readings)
    for name in profile.metric_names:
        without = [
            profile.read_metrics(scan(text, profile.metric_names - {name})) for text in texts
        ]
        assert without != readings, f"{name} changes no reading of the fixtures"


@pytest.mark.parametrize("engine", [n for n in ENGINES if PROFILES[n].info_path])
def test_each_info_document_reads_as_expected(engine: str) -> None:
    """The info documents give exactly the expected reading."""
    profile = PROFILES[engine]
    documents = expected(engine)["info"]
    assert documents
    for name, fields in documents.items():
        document = orjson.loads((folder(engine) / name).read_bytes())
        assert profile.read_info(document) == _reading(fields), name


@pytest.mark.parametrize("engine", ENGINES)
def test_health_answers_mean_what_the_engine_means(engine: str) -> None:
    """Each recorded health status is read as up or down as the engine means it."""
    profile = PROFILES[engine]
    cases = expected(engine)["health"]
    assert any(healthy for _, healthy in cases)
    assert any(not healthy for _, healthy in cases)
    for status, healthy in cases:
        assert profile.healthy(status) is healthy, status


@pytest.mark.parametrize("engine", ENGINES)
def test_error_bodies_reach_the_client_in_openais_shape(engine: str) -> None:
    """Each recorded error body becomes the expected status, code and message, in OpenAI's
    shape (or a 502 where the engine's body must not be relayed)."""
    profile = PROFILES[engine]
    cases = expected(engine)["errors"]
    assert len(cases) >= 2
    for case in cases:
        body = case["body"]
        raw = body.encode() if isinstance(body, str) else orjson.dumps(body)
        relayed = relayed_error(profile, case["status"], raw)
        if case["relayed"] is None:
            assert relayed is None, case
            continue
        assert relayed is not None, case
        status, code, message = case["relayed"]
        error = orjson.loads(relayed[1])["error"]
        assert (relayed[0], error["code"], error["message"]) == (status, code, message)
        assert set(error) >= {"message", "type", "code", "param"}


@pytest.mark.parametrize("engine", ENGINES)
def test_streams_read_as_the_engine_sent_them(engine: str) -> None:
    """Each recorded stream assembles to its text, and the relay's scanner and the
    assembler agree on how it ended: ``[DONE]``, an error event, usage."""
    streams = expected(engine)["streams"]
    assert {name.removesuffix(".sse") for name in streams} >= set(STREAM_KINDS)
    for name, want in streams.items():
        raw = (folder(engine) / name).read_bytes()
        scanner = SseScanner()
        scanner.scan_all(payloads_of(raw))
        assembler = StreamAssembler(want["endpoint"])
        for start in range(0, len(raw), 7):  # arbitrary read boundaries
            assembler.feed(raw[start : start + 7])
        assembler.close()
        assert (scanner.done, scanner.error) == (want["done"], want["error"]), name
        assert (assembler.done, assembler.error) == (want["done"], want["error"]), name
        assert not scanner.malformed, name
        assert not assembler.malformed, name
        usage = None
        if scanner.prompt_tokens is not None or scanner.completion_tokens is not None:
            usage = [scanner.prompt_tokens, scanner.completion_tokens]
        assert usage == want["usage"], name
        if not want["error"]:
            answer = orjson.loads(assembler.body(prompt_tokens=0))
            choice = answer["choices"][0]
            text = choice["message"]["content"] if want["endpoint"] == "chat" else choice["text"]
            assert text == want["text"], name


@pytest.mark.parametrize("engine", SCRAPED)
@given(st.text(max_size=300))
def test_any_page_reads_without_crashing(engine: str, text: str) -> None:
    """Whatever an engine (or something in its place) answers, reading it either gives a
    reading or says the page is not Prometheus text."""
    profile: EngineProfile = PROFILES[engine]
    try:
        samples = scan(text, profile.metric_names)
    except ValueError:
        return
    assert isinstance(profile.read_metrics(samples), Reading)


def test_a_reading_has_the_fields_the_fixtures_name() -> None:
    """The fixtures name only fields a reading has."""
    fields = {field.name for field in dataclasses.fields(Reading)}
    for engine in ENGINES:
        for group in ("metrics", "info"):
            for reading in expected(engine).get(group, {}).values():
                assert set(reading) <= fields, (engine, reading)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_error_mid_stream_reaches_the_client_in_openais_shape(engine: str) -> None:
    """The recorded error stream, as the relay writes its events again: the engine's error
    event in OpenAI's shape with the engine's message, every other event as it was."""
    profile = PROFILES[engine]
    streams = expected(engine)["streams"]
    for name, want in streams.items():
        if not want["error"]:
            continue
        payloads = payloads_of((folder(engine) / name).read_bytes())
        rewritten = payloads_of(openai_error_events(profile, payloads))
        assert len(rewritten) == len(payloads), name
        errors = [orjson.loads(p) for p in rewritten if b'"error"' in p]
        assert len(errors) == 1, name
        error = errors[0]["error"]
        assert set(error) == {"message", "type", "code", "param"}, name
        assert isinstance(error["code"], str), name
        assert error["message"], name
        kept = [p for p in rewritten if b'"error"' not in p]
        assert kept == [p for p in payloads if b'"error"' not in p], name
