"""HTTP errors in OpenAI's shape, with the retry headers the OpenAI SDKs honour.

``{"error": {"message", "type", "code", "param"}}``; 429 and 503 carry both
``Retry-After`` (integer seconds, at least 1) and ``retry-after-ms``.
"""

from __future__ import annotations

import orjson
from starlette.responses import Response

from sluicegate.core.retry import retry_after_values
from sluicegate.errors import SluicegateError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    501: "invalid_request_error",
    502: "api_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class GatewayError(SluicegateError):
    """An error the gateway answers with; raised anywhere below the handlers, rendered once."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        retry_after_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s
        self.headers = headers or {}

    def response(self) -> Response:
        """The HTTP response for this error."""
        return error_response(
            self.status,
            self.code,
            self.message,
            param=self.param,
            retry_after_s=self.retry_after_s,
            headers=self.headers,
        )


def retry_headers(retry_after_s: float) -> dict[str, str]:
    """``Retry-After`` (whole seconds, ≥ 1) and ``retry-after-ms`` (the precise wait)."""
    seconds, millis = retry_after_values(retry_after_s)
    return {"Retry-After": str(seconds), "retry-after-ms": str(millis)}


def error_body(status: int, code: str, message: str, param: str | None = None) -> bytes:
    """The JSON body of an OpenAI-shaped error."""
    return orjson.dumps(
        {
            "error": {
                "message": message,
                "type": _TYPES.get(status, "api_error"),
                "code": code,
                "param": param,
            }
        }
    )


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    param: str | None = None,
    retry_after_s: float | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """An OpenAI-shaped error response."""
    all_headers = dict(headers or {})
    if retry_after_s is not None:
        all_headers.update(retry_headers(retry_after_s))
    return Response(
        error_body(status, code, message, param),
        status_code=status,
        media_type="application/json",
        headers=all_headers,
    )
