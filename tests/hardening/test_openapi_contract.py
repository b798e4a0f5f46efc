"""The gateway's OpenAPI document, and schemathesis against a live gateway.

schemathesis generates requests from ``openapi.yaml`` (valid ones and ones that
break the schema), a real gateway on loopback answers them in front of an
emulated engine, and every answer must conform to the document: a documented
status, content type, headers (``Retry-After`` on 429/503...) and body schema.
No request may get a 500; the only 5xx allowed are the documented upstream ones
(502/503/504). The gateway runs with the batch lane (``batches:``), so the Files and
Batches endpoints are exercised too, aimed most of the time at a real file and batch.
"""

from __future__ import annotations

import importlib.resources
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi import checks

from sluicegate.engine import preset
from sluicegate.gateway.ops.ops_endpoints import openapi_document
from tests.gateway.gateway_harness import ADMIN_KEY, MODEL, Stack, http_call, stack

KEY = "sk-schemathesis-tenant"
BODY = """    lanes:
      - {name: interactive}
      - {name: batch}
tenants:
  - {name: a, api_key_env: KEY_A}
batches:
  lane: batch
  poll_interval_s: 0.1
  path: """
BATCH_LINE = {
    "custom_id": "c1",
    "method": "POST",
    "url": "/v1/chat/completions",
    "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
}
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
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A gateway with one tenant key and the batch lane, in front of a near-instant emulated
    engine."""
    database = tmp_path_factory.mktemp("contract") / "batches.db"
    body = f"{BODY}{database}\n"
    with stack(body, environ={"KEY_A": KEY}, engine=preset("instant")) as live:
        yield live


@dataclass(frozen=True)
class Targets:
    """A real input file and batch of the tenant, for generated requests to aim at."""

    sdk: openai.OpenAI
    file_id: str
    batch_id: str

    def fresh_file(self) -> str:
        """A new input file (for a delete to remove)."""
        return self.sdk.files.create(file=("in.jsonl", io.BytesIO(_jsonl())), purpose="batch").id


def _jsonl() -> bytes:
    return orjson.dumps(BATCH_LINE) + b"\n"


@pytest.fixture(scope="module")
def targets(gateway: Stack) -> Targets:
    """An uploaded input file and a batch of it."""
    sdk = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key=KEY, max_retries=0)
    file_id = sdk.files.create(file=("in.jsonl", io.BytesIO(_jsonl())), purpose="batch").id
    batch = sdk.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return Targets(sdk, file_id, batch.id)


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
        "/admin/undrain", "/admin/batches", "/admin/batches/{batch_id}/cancel",
        "/v1/files", "/v1/files/{file_id}", "/v1/files/{file_id}/content", "/v1/batches",
        "/v1/batches/{batch_id}", "/v1/batches/{batch_id}/cancel",
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
    batch_errors = {
        ("/v1/files", "post"): {"200", "400", "401", "404", "413", "415"},
        ("/v1/files", "get"): {"200", "400", "401", "404"},
        ("/v1/files/{file_id}", "get"): {"200", "401", "404"},
        ("/v1/files/{file_id}", "delete"): {"200", "401", "404"},
        ("/v1/files/{file_id}/content", "get"): {"200", "401", "404"},
        ("/v1/batches", "post"): {"200", "400", "401", "403", "404", "413"},
        ("/v1/batches", "get"): {"200", "400", "401", "404"},
        ("/v1/batches/{batch_id}", "get"): {"200", "401", "404"},
        ("/v1/batches/{batch_id}/cancel", "post"): {"200", "401", "404"},
    }
    for (path, method), statuses in batch_errors.items():
        assert statuses <= set(paths[path][method]["responses"]), (path, method)


BATCH_SOURCES = (
    "gateway/batch_lane/batch_api.py",
    "gateway/batch_lane/lane.py",
    "batches/lines.py",
    "batches/sqlite/finishing.py",
    "batches/sqlite/line_rows.py",
)
ERROR_CODE = re.compile(
    r"(?:GatewayError\(\s*\d{3},|error_response\(\s*\d{3},|LineError\(\s*[\w.]+,"
    r"|_fail\(\s*batch_id,)\s*\"([a-z_]+)\""
    r"|\(\s*\"[a-z_]+_at\",\s*\"([a-z_]+)\""
)


def test_every_batch_error_code_is_documented() -> None:
    """Each error code the Files and Batches APIs answer, and each code of an error line or a
    failed batch's errors, is named in the document (a missing one fails here)."""
    root = importlib.resources.files("sluicegate")
    codes: set[str] = set()
    for name in BATCH_SOURCES:
        text = root.joinpath(name).read_text("utf-8")
        codes |= {a or b for a, b in ERROR_CODE.findall(text)}
    assert {"file_too_large", "batches_disabled", "invalid_json_line", "batch_expired"} <= codes
    assert {"duplicate_custom_id", "batch_cancelled", "line_too_large"} <= codes
    document = orjson.dumps(DOCUMENT).decode()
    assert sorted(code for code in codes if f"`{code}`" not in document) == []


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


def test_batch_answers_conform(gateway: Stack, targets: Targets) -> None:
    """Upload, create, list, retrieve, download and cancel answer 200 with bodies that
    conform (fixed cases, so the 200 paths of the batch endpoints are always checked)."""
    auth = {"Authorization": f"Bearer {KEY}"}
    file_id, batch_id = targets.file_id, targets.batch_id
    cases = [
        OPERATIONS["POST /v1/files"].Case(
            body={"file": _jsonl(), "purpose": "batch"}, media_type="multipart/form-data"
        ),
        OPERATIONS["POST /v1/batches"].Case(
            body={"input_file_id": file_id, "endpoint": "/v1/completions",
                  "completion_window": "1h", "metadata": {"k": "v"}},
            media_type="application/json",
        ),
        OPERATIONS["GET /v1/files"].Case(query={"limit": 2}),
        OPERATIONS["GET /v1/batches"].Case(query={"limit": 2}),
        OPERATIONS["GET /v1/files/{file_id}"].Case(path_parameters={"file_id": file_id}),
        OPERATIONS["GET /v1/files/{file_id}/content"].Case(path_parameters={"file_id": file_id}),
        OPERATIONS["GET /v1/batches/{batch_id}"].Case(path_parameters={"batch_id": batch_id}),
        OPERATIONS["POST /v1/batches/{batch_id}/cancel"].Case(
            path_parameters={"batch_id": batch_id}
        ),
        OPERATIONS["DELETE /v1/files/{file_id}"].Case(
            path_parameters={"file_id": targets.fresh_file()}
        ),
    ]  # fmt: skip
    for case in cases:
        response = case.call(base_url=gateway.base_url, headers=auth, timeout=10)
        assert response.status_code == 200, (case.operation.label, response.text[:500])
        case.validate_response(response, checks=CHECKS)


def _aim_at_batches(case: schemathesis.Case, label: str, targets: Targets) -> None:
    """Point a generated batch request at the tenant's real file or batch."""
    if "file_id" in case.path_parameters:
        fresh = label.startswith("DELETE")
        case.path_parameters["file_id"] = targets.fresh_file() if fresh else targets.file_id
    if "batch_id" in case.path_parameters:
        case.path_parameters["batch_id"] = targets.batch_id
    if label == "POST /v1/batches" and isinstance(case.body, dict):
        case.body["input_file_id"] = targets.file_id
        if case.headers:
            case.headers.pop("X-Sluicegate-Lane", None)


def _strategy(label: str) -> st.SearchStrategy[schemathesis.Case]:
    operation = OPERATIONS[label]
    return st.one_of(
        operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
        operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )


@pytest.mark.parametrize("label", sorted(OPERATIONS))
def test_every_answer_conforms_to_the_document(
    gateway: Stack, targets: Targets, label: str
) -> None:
    """Generated requests, valid and invalid, get documented answers and never a 500.

    Three in four bodies name the configured model and use the default lane, so that
    requests also reach the engine and are answered 200 (JSON or a stream); three in four
    batch requests name the tenant's real file or batch, so that they are answered 200 too.
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
        if aim and label.split(" ")[1].startswith(("/v1/files", "/v1/batches")):
            _aim_at_batches(case, label, targets)
        response = case.call(
            base_url=gateway.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=10
        )
        status = response.status_code
        assert status < 500 or status in UPSTREAM_5XX, (status, response.text[:500])
        case.validate_response(response, checks=CHECKS)

    run()
