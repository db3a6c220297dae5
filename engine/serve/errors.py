"""API errors: one exception the routes raise, rendered in each API's own error format."""

from __future__ import annotations

from starlette.responses import JSONResponse

# HTTP status -> the OpenAI and Anthropic error "type" strings
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
                 413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error",
                 504: "timeout_error"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                    413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 503: "overloaded_error",
                    504: "api_error"}


class APIError(Exception):
    """A request the server refuses or cannot answer, with its HTTP status.

    Args:
        status: the HTTP status code.
        message: what went wrong, for the client.
        param: the request field at fault, if one is.
        code: a short machine-readable code (OpenAI's ``code``), e.g. "model_not_found".
        headers: extra response headers (``Retry-After`` on 429).
    """

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}


def openai_error_body(error: APIError) -> dict:
    """The OpenAI error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": error.message, "type": _OPENAI_TYPES.get(error.status, "server_error"),
                      "param": error.param, "code": error.code}}


def anthropic_error_body(error: APIError) -> dict:
    """The Anthropic error object: ``{"type": "error", "error": {"type", "message"}}``."""
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(error.status, "api_error"),
                                       "message": error.message}}


def error_response(error: APIError, flavor: str = "openai") -> JSONResponse:
    """A JSON response carrying ``error`` in the format of ``flavor`` ("openai" or "anthropic")."""
    body = anthropic_error_body(error) if flavor == "anthropic" else openai_error_body(error)
    return JSONResponse(body, status_code=error.status, headers=error.headers)
