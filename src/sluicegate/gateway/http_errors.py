"""HTTP errors in OpenAI's shape, with the retry headers the OpenAI SDKs honour.

``{"error": {"message", "type", "code", "param"}}``; 429 and 503 carry both
``Retry-After`` (integer seconds, at least 1) and ``retry-after-ms``.

Code below the handlers raises ``GatewayError`` and never renders it: an error becomes
an HTTP answer at one boundary, ``render_error``, called by the app's exception handlers
(``gateway/app.py``, through ``error_response``), and by the inference path's one
boundary (``gateway/request/handlers.py``), which answers the same bytes.
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


Headers = list[tuple[bytes, bytes]]
"""Response headers as ASGI sends them: lower-case names, bytes."""


class GatewayError(SluicegateError):
    """An error the gateway answers with: raised anywhere below the handlers, never caught
    to be answered there; ``render_error`` makes its HTTP answer."""

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


def render_error(error: GatewayError) -> tuple[int, bytes, Headers]:
    """The HTTP answer to ``error``, the one rendering of every error: its status, its
    OpenAI-shaped JSON body, and a new list of its headers: ``content-type:
    application/json``, then ``error.headers``, then ``Retry-After`` and ``retry-after-ms``
    when it has a ``retry_after_s``. ``Content-Length`` is left to the caller, which frames
    the body (``asgi_send.send_body(send, *render_error(error))`` on the plain-ASGI path,
    ``error_response`` under Starlette)."""
    extra = dict(error.headers)
    if error.retry_after_s is not None:
        extra.update(retry_headers(error.retry_after_s))
    headers: Headers = [(b"content-type", b"application/json")]
    headers.extend((name.lower().encode(), value.encode()) for name, value in extra.items())
    return error.status, error_body(error.status, error.code, error.message, error.param), headers


def error_response(error: GatewayError) -> Response:
    """``render_error``'s answer as a Starlette response (its headers in the same order,
    ``Content-Length`` last), for the app's exception handlers."""
    status, body, headers = render_error(error)
    response = Response(body, status_code=status)
    response.raw_headers[:0] = headers
    return response
