"""The gateway's OpenAPI document, and schemathesis against a live gateway.

schemathesis generates requests from ``openapi.yaml`` (valid ones and ones that
break the schema), a real gateway on loopback answers them in front of an
emulated engine, and every answer must conform to the document: a documented
status, content type, headers (``Retry-After`` on 429/503...) and body schema.
No request may get a 500; the only 5xx allowed are the documented upstream ones
(502/503/504).
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi import checks

from sluicegate.engine import preset
from sluicegate.gateway.ops import openapi_document
from tests.gateway.gateway_harness import ADMIN_KEY, MODEL, Stack, http_call, stack

KEY = "sk-schemathesis-tenant"
BODY = """    lanes:
      - {name: interactive}
      - {name: batch}
tenants:
  - {name: a, api_key_env: KEY_A}
"""
DOCUMENT = orjson.loads(openapi_document())
# Draining is one-way for the process: it would turn every later answer into 503 draining.
# The document itself is static; its serving is checked below.
SCHEMA = (
    schemathesis.openapi.from_dict(DOCUMENT)
    .exclude(path="/admin/drain")
    .exclude(path="/openapi.json")
)
OPERATIONS = {result.ok().label: result.ok() for result in SCHEMA.get_all_operations()}
CHECKS = [
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
]
UPSTREAM_5XX = {502, 503, 504}


@pytest.fixture(scope="module")
def gateway() -> Iterator[Stack]:
    """A gateway with one tenant key, in front of a near-instant emulated engine."""
    with stack(BODY, environ={"KEY_A": KEY}, engine=preset("instant")) as live:
        yield live


def test_document_is_valid_openapi_3_1() -> None:
    """The YAML parses to an OpenAPI 3.1 document that the 3.1 meta-schema accepts."""
    assert DOCUMENT["openapi"].startswith("3.1")
    schemathesis.openapi.from_dict(DOCUMENT).validate()


def test_document_names_every_endpoint_and_error_status() -> None:
    """Every endpoint of DESIGN §9 is documented; the inference ones list each refusal, and
    429/503 require ``Retry-After`` and ``retry-after-ms``."""
    paths = DOCUMENT["paths"]
    expected = {
        "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/healthz",
        "/readyz", "/metrics", "/openapi.json", "/admin/state", "/admin/drain", "/dashboard",
    }  # fmt: skip
    assert set(paths) == expected
    responses = DOCUMENT["components"]["responses"]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        statuses = set(paths[path]["post"]["responses"])
        assert {"200", "400", "401", "403", "404", "413", "415", "429", "502", "503"} <= statuses
        assert {"504", "408", "431"} <= statuses
    for name in ("TooManyRequests", "ServiceUnavailable"):
        headers = responses[name]["headers"]
        assert set(headers) == {"Retry-After", "retry-after-ms"}
    for path in ("/admin/state", "/admin/drain"):
        operation = next(iter(paths[path].values()))
        assert operation["security"] == [{"adminKey": []}]


def test_openapi_json_is_served(gateway: Stack) -> None:
    """``GET /openapi.json`` answers the document as JSON, without a key."""
    reply = http_call(gateway.base_url, "GET", "/openapi.json")
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.json() == DOCUMENT


@pytest.mark.parametrize(
    ("label", "body"),
    [
        ("POST /v1/chat/completions",
         {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
        ("POST /v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4}),
    ],
)  # fmt: skip
@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_served_answers_conform(
    gateway: Stack, label: str, body: dict[str, object], stream: bool
) -> None:
    """A served answer, JSON or a stream checked event by event, conforms (fixed cases, so
    the 200 paths are always checked whatever the generator draws)."""
    case = OPERATIONS[label].Case(body={**body, "stream": stream}, media_type="application/json")
    response = case.call(
        base_url=gateway.base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=10
    )
    assert response.status_code == 200, response.text[:500]
    kind = "text/event-stream" if stream else "application/json"
    assert response.headers["content-type"][0].startswith(kind)
    case.validate_response(response, checks=CHECKS)


def _strategy(label: str) -> st.SearchStrategy[schemathesis.Case]:
    operation = OPERATIONS[label]
    return st.one_of(
        operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
        operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )


@pytest.mark.parametrize("label", sorted(OPERATIONS))
def test_every_answer_conforms_to_the_document(gateway: Stack, label: str) -> None:
    """Generated requests, valid and invalid, get documented answers and never a 500.

    Three in four bodies name the configured model and use the default lane, so that
    requests also reach the engine and are answered 200 (JSON or a stream).
    """
    key = ADMIN_KEY if label.split(" ")[1].startswith("/admin/") else KEY

    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(case=_strategy(label), aim=st.integers(0, 3))
    def run(case: schemathesis.Case, aim: int) -> None:
        if aim and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = MODEL
            if case.headers:
                case.headers.pop("X-Sluicegate-Lane", None)
        response = case.call(
            base_url=gateway.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=10
        )
        status = response.status_code
        assert status < 500 or status in UPSTREAM_5XX, (status, response.text[:500])
        case.validate_response(response, checks=CHECKS)

    run()
