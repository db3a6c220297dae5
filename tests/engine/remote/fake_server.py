"""A small misbehaving OpenAI-compatible server for the remote fault tests: Starlette on loopback, in its own process
(so a test can kill it mid-stream). The first path segment picks the behaviour: ``/ok/v1``, ``/stall/v1`` …

Run: ``python -m tests.engine.remote.fake_server PORT``.
"""

from __future__ import annotations

import asyncio
import json
import sys

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from engine.serve.sse import DONE, data_event

KEY = "sk-right-key-7f3a9c"  # the one key /auth/ accepts
WORDS = ["Hello", ",", " partial", " world", "!"]
STATS = {"requests": 0, "disconnected": 0, "busy_calls": 0}


def chunk(text: str | None = None, finish: str | None = None, usage: dict | None = None) -> bytes:
    choices = [] if usage else [{"index": 0, "delta": {"content": text} if text is not None else {},
                                 "finish_reason": finish}]
    body = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "fake", "choices": choices}
    if usage:
        body["usage"] = usage
    return data_event(body)


async def good_stream(words=WORDS, delay: float = 0.0):
    for word in words:
        yield chunk(word)
        await asyncio.sleep(delay)
    yield chunk(finish="stop")
    yield chunk(usage={"prompt_tokens": 7, "completion_tokens": len(words), "total_tokens": 7 + len(words)})
    yield DONE


async def chat(request: Request):
    mode = request.path_params["mode"]
    STATS["requests"] += 1
    body = await request.json()
    if mode == "auth" and request.headers.get("authorization") != f"Bearer {KEY}":
        return JSONResponse({"error": {"message": "Invalid API key", "type": "authentication_error"}}, 401)
    if mode == "busy":
        STATS["busy_calls"] += 1
        if STATS["busy_calls"] % 2 == 1:  # every other call: 429, then the retry succeeds
            return JSONResponse({"error": {"message": "Too many requests"}}, 429, headers={"Retry-After": "1"})
    if mode == "overloaded":
        return JSONResponse({"error": {"message": "model overloaded"}}, 503)
    if body.get("model") == "missing":
        return JSONResponse({"error": {"message": "model 'missing' not found"}}, 404)
    streams = {"ok": good_stream, "auth": good_stream, "busy": good_stream, "stall": stalled, "malformed": malformed,
               "truncated": truncated, "thinking": thinking, "slow": lambda: slow(request), "die": lambda: good_stream(WORDS * 40, 0.1)}
    return StreamingResponse(streams[mode](), media_type="text/event-stream")


async def thinking():
    for part in ("The user", " greets."):  # as llama-server and vLLM send a reasoning model's thinking
        yield data_event({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "fake",
                          "choices": [{"index": 0, "delta": {"reasoning_content": part}, "finish_reason": None}]})
    yield chunk("Hello!")
    yield chunk(finish="stop")
    yield DONE


async def stalled():
    yield chunk("Hello")
    yield chunk(", partial")
    await asyncio.sleep(30)  # the client's stall timeout ends it long before
    yield chunk(" too late")


async def malformed():
    yield chunk("Hello")
    yield b"data: {this is not json\n\n"


async def truncated():
    yield chunk("Hello")
    yield chunk(", partial")  # then the body ends with no finish_reason and no [DONE]


async def slow(request: Request):
    try:
        for i in range(600):
            yield chunk(f" {i}")
            await asyncio.sleep(0.05)
        yield chunk(finish="length")
        yield DONE
    except asyncio.CancelledError:
        STATS["disconnected"] += 1
        raise


async def models(request: Request):
    if request.path_params["mode"] == "auth" and request.headers.get("authorization") != f"Bearer {KEY}":
        return JSONResponse({"error": {"message": "Invalid API key", "type": "authentication_error"}}, 401)
    return JSONResponse({"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "test"},
                                                    {"id": "fake-2", "object": "model"}]})


async def stats(request: Request):
    return JSONResponse(STATS)


app = Starlette(routes=[Route("/{mode}/v1/chat/completions", chat, methods=["POST"]),
                        Route("/{mode}/v1/models", models), Route("/stats", stats)])

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error")
