"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

Contract: raise `ApiError(status, message, code=..., param=...)` anywhere in request handling; the
app's middleware turns it (and anything unexpected, as a 500 with no stack trace) into the body
`error_body` builds. `headers` (e.g. Retry-After) go on the response.
"""

from __future__ import annotations

from typing import Any

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
         429: "rate_limit_error", 500: "internal_error", 503: "service_unavailable"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, code=self.code, param=self.param)


def error_body(status: int, message: str, *, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": TYPES.get(status, "invalid_request_error"), "param": param,
                      "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)
