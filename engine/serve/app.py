"""The ASGI application: routes, API-key check, body size limit, CORS, ``/health`` and ``/metrics``.

Every error a client can cause comes back as the API's own error object (Anthropic's on ``/v1/messages``,
OpenAI's elsewhere); nothing a request carries is executed.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pydantic
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from . import anthropic_routes, openai_routes
from .anthropic_schemas import MessagesRequest
from .errors import APIError, error_response
from .host import RequestRecord, ServedModel
from .openai_schemas import ChatCompletionRequest, CompletionRequest

MAX_BODY_BYTES = 4 << 20  # 4 MiB: far more than any prompt that fits a context
OPEN_PATHS = ("/health",)  # answered without an API key


async def read_json(request: Request, max_bytes: int = MAX_BODY_BYTES) -> object:
    """The request body parsed as JSON; 413 past ``max_bytes`` (read no further), 400 when it is not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise APIError(413, f"the request body of {declared} bytes exceeds the limit of {max_bytes}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise APIError(413, f"the request body exceeds the limit of {max_bytes} bytes")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None


def parse(model: type[pydantic.BaseModel], data: object) -> pydantic.BaseModel:
    """Validate ``data`` against a request model; 400 naming the first bad field."""
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise APIError(400, f"{where}: {first['msg']} ({e.error_count()} error(s))", param=where or None) from None


class APIKeyMiddleware:
    """Refuses requests without the API key (``Authorization: Bearer KEY`` or ``x-api-key: KEY``), compared in
    constant time."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app, self.key = app, api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["method"] == "OPTIONS":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        given = headers.get(b"x-api-key", b"")
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        if not hmac.compare_digest(given, self.key):
            flavor = "anthropic" if scope["path"].startswith("/v1/messages") else "openai"
            response = error_response(APIError(401, "a valid API key is required", code="invalid_api_key"), flavor)
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


def _endpoint(served: ServedModel, handler: Callable[..., Awaitable[Response]], schema: type[pydantic.BaseModel],
              name: str, flavor: str = "openai") -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        body = None
        try:
            body = parse(schema, await read_json(request))
            response = await handler(served, request, body)
        except APIError as e:
            served.stats.requests[(name, e.status)] += 1
            model = getattr(body, "model", "")
            served.stats.record(RequestRecord(0, name, model, 0, 0, 0, 0.0, 0.0, "error", time.time(), e.status))
            return error_response(e, flavor)
        served.stats.requests[(name, response.status_code)] += 1
        return response
    return endpoint


def metrics_text(served: ServedModel) -> str:
    """The server's counters in the Prometheus text exposition format."""
    stats, lines = served.stats, []
    lines += ["# HELP hearth_requests_total API requests answered, by endpoint and HTTP status.",
              "# TYPE hearth_requests_total counter"]
    for (endpoint, status), count in sorted(stats.requests.items()):
        lines.append(f'hearth_requests_total{{endpoint="{endpoint}",status="{status}"}} {count}')
    for name, help_text, kind, value in (
            ("hearth_prompt_tokens_total", "Prompt tokens of finished requests.", "counter", stats.prompt_tokens),
            ("hearth_completion_tokens_total", "Generated tokens of finished requests.", "counter",
             stats.completion_tokens),
            ("hearth_rejected_busy_total", "Requests refused with 429 because the queue was full.", "counter",
             stats.rejected_busy),
            ("hearth_requests_active", "Requests queued or running now.", "gauge", served.active)):
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"]
    lines += ["# HELP hearth_time_to_first_token_seconds Time to first token of finished requests.",
              "# TYPE hearth_time_to_first_token_seconds summary",
              f"hearth_time_to_first_token_seconds_sum {stats.ttft_sum_s:.6f}",
              f"hearth_time_to_first_token_seconds_count {stats.finished}"]
    return "\n".join(lines) + "\n"


def create_app(served: ServedModel, api_key: str | None = None, allowed_origins: tuple[str, ...] = (),
               manage_lifetime: bool = True) -> Starlette:
    """The ASGI app serving ``served``.

    Args:
        served: the server's models and the host whose scheduler runs their sequences.
        api_key: required on every request but ``/health`` when set.
        allowed_origins: origins allowed by CORS; none (the default) leaves CORS off.
        manage_lifetime: start the host (the scheduler thread) when the app starts and stop it when the app stops;
            False when the host outlives the server (the app's engine host).
    """
    async def models(request: Request) -> Response:
        served.stats.requests[("models", 200)] += 1
        return openai_routes.list_models(served)

    async def health(request: Request) -> Response:
        if served.healthy:
            return JSONResponse({"status": "ok", "model": served.name, "active_requests": served.active})
        return JSONResponse({"status": "error", "detail": served.error or "the scheduler is not running"},
                            status_code=503)

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(metrics_text(served), media_type="text/plain; version=0.0.4")

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(APIError(404, f"no route {request.method} {request.url.path}"))

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return error_response(APIError(405, f"{request.method} is not allowed on {request.url.path}"))

    async def server_error(request: Request, exc: Exception) -> Response:
        return error_response(APIError(500, f"internal error: {type(exc).__name__}"))

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", _endpoint(served, openai_routes.chat_completions, ChatCompletionRequest,
                                                "chat"), methods=["POST"]),
        Route("/v1/completions", _endpoint(served, openai_routes.completions, CompletionRequest, "completions"),
              methods=["POST"]),
        Route("/v1/messages", _endpoint(served, anthropic_routes.messages, MessagesRequest, "messages",
                                        "anthropic"), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    middleware = []
    if allowed_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["GET", "POST"],
                                     allow_headers=["authorization", "content-type", "x-api-key",
                                                    "anthropic-version"]))
    if api_key:
        middleware.append(Middleware(APIKeyMiddleware, api_key=api_key))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if manage_lifetime:
            served.start()
        try:
            yield
        finally:
            if manage_lifetime:
                served.close()

    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                     exception_handlers={404: not_found, 405: method_not_allowed, 500: server_error})
