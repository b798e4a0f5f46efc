"""OpenAI's Files and Batches APIs (``/v1/files``, ``/v1/batches``) over the batch database.

Every object belongs to the tenant whose key created it; another tenant's id is
a 404, as an unknown one is. An upload (``purpose: batch``, JSONL) is checked
line by line as it is stored (UTF-8, at most ``batches.max_lines`` lines of at
most ``batches.max_line_bytes``, at most ``batches.max_file_bytes``, within the
tenant's ``batches.quota``) and answered 200 once it is on disk; a create is
answered once the batch is (``validating``; the runner checks its lines). A file
past its ``expires_at`` is a 404 even before the sweeper deletes it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Message

from sluicegate.batches.batch_backend import (
    BatchBackend,
    Counts,
    NewBatch,
    NewFile,
    QuotaExceededError,
    Record,
)
from sluicegate.batches.batches_config import BatchesSpec, window_seconds
from sluicegate.batches.lines import ENDPOINTS
from sluicegate.batches.objects import batch_object, file_object
from sluicegate.gateway.batch_lane.upload_reader import (
    bounded_lines,
    expires_at,
    quota_refusal,
    read_capped,
)
from sluicegate.gateway.http_errors import GatewayError
from sluicegate.gateway.state import GatewayState
from sluicegate.store.store_errors import StorageError, storage_error

FORM_OVERHEAD_BYTES = 64 * 1024
"""What a multipart upload may carry besides the file (boundaries, the purpose field)."""
MAX_CREATE_BYTES = 64 * 1024
MAX_METADATA_KEYS = 16


def _json(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status, media_type="application/json")


def _not_found(kind: str, object_id: str) -> GatewayError:
    # The id is echoed only when short and plain: it came from the client.
    shown = object_id if len(object_id) <= 64 and object_id.isascii() else "…"
    return GatewayError(404, "not_found", f"no such {kind}: {shown!r}")


FULL_RETRY_S = 30.0
"""``Retry-After`` of a 507 ``storage_full``: room comes back when files are deleted (or
expire), not within a second."""
UNAVAILABLE_RETRY_S = 1.0


def storage_refusal(failure: StorageError) -> GatewayError:
    """The answer to a request whose storage call met ``failure``: 507 ``storage_full`` or 503
    ``storage_unavailable``, with ``Retry-After``. The message never carries the original
    error's text (redis-py's may hold the request's lines)."""
    if failure.full:
        return GatewayError(
            507,
            "storage_full",
            "batch storage is full; try again later",
            retry_after_s=FULL_RETRY_S,
        )
    return GatewayError(
        503,
        "storage_unavailable",
        "batch storage is unavailable; try again shortly",
        retry_after_s=UNAVAILABLE_RETRY_S,
    )


class BatchApi:
    """The Files and Batches endpoints of one gateway process."""

    def __init__(self, state: GatewayState, spec: BatchesSpec, backend: BatchBackend) -> None:
        self.state = state
        self.spec = spec
        self.backend = backend

    def routes(self) -> list[Route]:
        """The Starlette routes of both APIs."""
        return [
            Route("/v1/files", self._guard(self.upload), methods=["POST"]),
            Route("/v1/files", self._guard(self.list_files), methods=["GET"]),
            Route("/v1/files/{file_id}", self._guard(self.get_file), methods=["GET"]),
            Route("/v1/files/{file_id}", self._guard(self.delete_file), methods=["DELETE"]),
            Route("/v1/files/{file_id}/content", self._guard(self.content), methods=["GET"]),
            Route("/v1/batches", self._guard(self.create), methods=["POST"]),
            Route("/v1/batches", self._guard(self.list_batches), methods=["GET"]),
            Route("/v1/batches/{batch_id}", self._guard(self.get_batch), methods=["GET"]),
            Route("/v1/batches/{batch_id}/cancel", self._guard(self.cancel), methods=["POST"]),
        ]

    on_storage_error: Callable[[str, StorageError], None] | None = None
    """Told of each request refused for a storage failure (the lane counts them)."""

    def _guard(self, endpoint: Any) -> Any:
        async def guarded(request: Request) -> Response:
            try:
                tenant = self.state.tenant_of(request.headers.getlist("authorization"))
                response: Response = await endpoint(request, tenant)
                return response
            except Exception as exc:
                failure = storage_error(exc)
                if failure is None:
                    raise
                if self.on_storage_error is not None:
                    self.on_storage_error("api", failure)
                # Not chained: the original error's text may hold the request's lines.
                raise storage_refusal(failure) from None

        return guarded

    async def upload(self, request: Request, tenant: str) -> Response:
        """``POST /v1/files``: store a JSONL file of requests (``purpose: batch``)."""
        cap = self.spec.max_file_bytes + FORM_OVERHEAD_BYTES
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise GatewayError(
                413, "file_too_large", f"the file exceeds {self.spec.max_file_bytes} bytes"
            )
        media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media != "multipart/form-data":
            raise GatewayError(
                415, "unsupported_media_type", "upload the file as multipart/form-data"
            )
        received = 0
        receive = request.receive

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > cap:
                raise GatewayError(
                    413, "file_too_large", f"the file exceeds {self.spec.max_file_bytes} bytes"
                )
            return message

        reader = Request(request.scope, counted)
        try:
            form = await _read_form(reader)
        except MultiPartException as exc:
            raise GatewayError(400, "invalid_request", f"malformed upload: {exc.message}") from None
        except ClientDisconnect:
            return Response(status_code=400)
        try:
            purpose = form.get("purpose")
            upload = form.get("file")
            if purpose != "batch":
                raise GatewayError(
                    400, "invalid_purpose", "purpose must be 'batch'", param="purpose"
                )
            if not isinstance(upload, UploadFile):
                raise GatewayError(400, "missing_file", "the upload has no file part", param="file")
            size = upload.size or 0
            if size > self.spec.max_file_bytes:
                raise GatewayError(
                    413, "file_too_large", f"the file exceeds {self.spec.max_file_bytes} bytes"
                )
            if size == 0:
                raise GatewayError(400, "empty_file", "the file is empty", param="file")
            name = (upload.filename or "upload.jsonl")[:256]
            now = int(time.time())
            until = expires_at(form, self.spec, now)
            upload.file.seek(0)
            lines = bounded_lines(upload.file, self.spec.max_lines, self.spec.max_line_bytes)
            file = NewFile(
                tenant=tenant, purpose="batch", filename=name, size=size, now=now, expires_at=until
            )
            row = await self.backend.create_file(file, lines, quota=self.spec.quota.of(tenant))
        except QuotaExceededError as exc:
            raise quota_refusal(exc, self.spec) from None
        finally:
            await form.close()
        if row["lines"] == 0:
            await self.backend.delete_file(tenant, row["id"])
            raise GatewayError(400, "empty_file", "the file has no lines", param="file")
        return _json(file_object(row))

    async def list_files(self, request: Request, tenant: str) -> Response:
        """``GET /v1/files``: the tenant's files, newest first (``after``, ``limit``)."""
        after, limit = _page(request)
        purpose = request.query_params.get("purpose")
        rows, more = await self.backend.list_files(tenant, purpose, after, limit)
        now = time.time()
        return _json(_listing([file_object(r) for r in rows if not _expired(r, now)], more))

    async def _file(self, tenant: str, file_id: str) -> Record:
        row = await self.backend.get_file(tenant, file_id)
        if row is None or _expired(row, time.time()):
            raise _not_found("file", file_id)
        return row

    async def get_file(self, request: Request, tenant: str) -> Response:
        """``GET /v1/files/{id}``."""
        return _json(file_object(await self._file(tenant, request.path_params["file_id"])))

    async def delete_file(self, request: Request, tenant: str) -> Response:
        """``DELETE /v1/files/{id}``."""
        file_id = request.path_params["file_id"]
        if not await self.backend.delete_file(tenant, file_id):
            raise _not_found("file", file_id)
        return _json({"id": file_id, "object": "file", "deleted": True})

    async def content(self, request: Request, tenant: str) -> Response:
        """``GET /v1/files/{id}/content``: the file's lines, streamed page by page."""
        file_id = request.path_params["file_id"]
        await self._file(tenant, file_id)

        async def pages() -> AsyncIterator[bytes]:
            start = 0
            while page := await self.backend.file_page(file_id, start):
                start += len(page)
                yield b"".join(line + b"\n" for line in page)

        return StreamingResponse(
            pages(), media_type="application/jsonl", headers={"Cache-Control": "no-store"}
        )

    async def create(self, request: Request, tenant: str) -> Response:
        """``POST /v1/batches``: a batch of the tenant's input file, in the lane named by
        ``X-Sluicegate-Lane`` (default ``batches.lane``)."""
        try:
            body = await read_capped(request, MAX_CREATE_BYTES)
        except ClientDisconnect:
            return Response(status_code=400)
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise GatewayError(400, "invalid_json", "the body is not valid JSON") from None
        if not isinstance(data, dict):
            raise GatewayError(400, "invalid_json", "the body must be a JSON object")
        endpoint = data.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise GatewayError(
                400,
                "invalid_endpoint",
                f"endpoint must be one of {list(ENDPOINTS)}",
                param="endpoint",
            )
        window = data.get("completion_window")
        window_s = window_seconds(window) if isinstance(window, str) else None
        if not isinstance(window, str) or window_s is None or window_s > self.spec.max_window_s:
            raise GatewayError(
                400,
                "invalid_completion_window",
                "completion_window must be a duration such as 24h, at most "
                f"{self.spec.max_completion_window} (batches.max_completion_window)",
                param="completion_window",
            )
        metadata = _metadata(data.get("metadata"))
        lane = self._lane(request, tenant)
        file_id = data.get("input_file_id")
        if not isinstance(file_id, str):
            raise GatewayError(
                400, "invalid_request", "input_file_id is required", param="input_file_id"
            )
        file = await self._file(tenant, file_id)
        if file["purpose"] != "batch":
            raise GatewayError(
                400,
                "invalid_file",
                "input_file_id must be a file of purpose 'batch'",
                param="input_file_id",
            )
        try:
            batch = NewBatch(
                tenant=tenant,
                input_file_id=file_id,
                endpoint=endpoint,
                window=window,
                window_s=window_s,
                lane=lane,
                metadata=metadata,
                now=int(time.time()),
            )
            row = await self.backend.create_batch(batch, quota=self.spec.quota.of(tenant))
        except QuotaExceededError as exc:
            raise quota_refusal(exc, self.spec) from None
        return _json(batch_object(row, Counts()))

    def _lane(self, request: Request, tenant: str) -> str:
        lane = request.headers.get("x-sluicegate-lane") or self.spec.lane
        if not any(
            lane == spec.name for model in self.state.models.values() for spec in model.lanes
        ):
            raise GatewayError(400, "invalid_lane", f"no model has a lane {lane[:64]!r}")
        allowed = self.state.tenant_spec(tenant).allowed_lanes
        if allowed is not None and lane not in allowed:
            raise GatewayError(403, "lane_not_allowed", f"lane {lane!r} is not allowed")
        return lane

    async def get_batch(self, request: Request, tenant: str) -> Response:
        """``GET /v1/batches/{id}``: the batch and its progress."""
        row = await self.backend.get_batch(tenant, request.path_params["batch_id"])
        if row is None:
            raise _not_found("batch", request.path_params["batch_id"])
        return _json(await self._object(row))

    async def list_batches(self, request: Request, tenant: str) -> Response:
        """``GET /v1/batches``: the tenant's batches, newest first (``after``, ``limit``)."""
        after, limit = _page(request)
        rows, more = await self.backend.list_batches(tenant, after, limit)
        return _json(_listing([await self._object(row) for row in rows], more))

    async def cancel(self, request: Request, tenant: str) -> Response:
        """``POST /v1/batches/{id}/cancel``: ``cancelling`` until the runner ends it."""
        batch_id = request.path_params["batch_id"]
        row = await self.backend.cancel_batch(tenant, batch_id, int(time.time()))
        if row is None:
            raise _not_found("batch", batch_id)
        return _json(await self._object(row))

    async def _object(self, row: Any) -> dict[str, Any]:
        return batch_object(row, await self.backend.batch_counts(row["id"]))


async def _read_form(request: Request) -> FormData:
    """The multipart form of an upload (files spooled to disk above 1 MiB).

    A body that ends inside the file part gives a form without it; Starlette then keeps
    that part's temporary file open until the collector finds it, so it is closed here.
    """
    parser = MultiPartParser(
        request.headers, request.stream(), max_files=1, max_fields=8, max_part_size=64 * 1024
    )
    try:
        form = await parser.parse()
    finally:
        kept = {id(value.file) for _, value in parser.items if isinstance(value, UploadFile)}
        for file in getattr(parser, "_files_to_close_on_error", []):
            if id(file) not in kept:
                file.close()
    return form


def _expired(row: Record, now: float) -> bool:
    """Whether a file is past its ``expires_at`` (the sweeper deletes it soon)."""
    until = row.get("expires_at")
    return until is not None and until <= now


def _page(request: Request) -> tuple[str | None, int]:
    """``after`` and ``limit`` (1–100, default 20) of a list request."""
    params = request.query_params
    raw = params.get("limit", "20")
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 100:
        raise GatewayError(
            400, "invalid_limit", "limit must be an integer from 1 to 100", param="limit"
        )
    return params.get("after"), int(raw)


def _listing(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def _metadata(value: object) -> dict[str, str] | None:
    """A batch's ``metadata``: at most 16 string pairs (keys ≤ 64, values ≤ 512 characters)."""
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or len(value) > MAX_METADATA_KEYS
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in value.items()
        )
    ):
        raise GatewayError(
            400,
            "invalid_metadata",
            "metadata must hold at most 16 string pairs (keys ≤ 64, values ≤ 512 characters)",
            param="metadata",
        )
    return value
