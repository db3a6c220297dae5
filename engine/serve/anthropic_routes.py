"""The Anthropic endpoint ``POST /v1/messages``, streaming (named events) and not, with tools (tool_use and
tool_result blocks; a streamed reply with tools is sent when it is complete)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..generate import GenerationEvent
from ..sampling import SamplingParams
from . import sse
from .anthropic_schemas import Message, MessagesRequest, MessageUsage, TextBlock, ToolResultBlock, ToolUseBlock
from .errors import APIError
from .host import BoundModel, RequestRecord, ServedModel
from .openai_routes import forced_tool_grammar, token_budget
from .tool_calls import CallDelta, ToolCallStream, parse_tool_calls, template_messages_with_calls


def _messages(body: MessagesRequest) -> list[dict]:
    """The conversation as the chat template reads it: the system prompt first, tool results as tool turns."""
    out = [{"role": "system", "content": body.system_text()}] if body.system else []
    for message in body.messages:
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
            continue
        text = "".join(block.text for block in message.content if block.type == "text")
        calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}}
                 for b in message.content if b.type == "tool_use"]
        results = [b for b in message.content if isinstance(b, ToolResultBlock)]
        if text or calls or not results:
            out.append({"role": message.role, "content": text, **({"tool_calls": calls} if calls else {})})
        out.extend({"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()} for b in results)
    return out


def _stop(finish: str | None, raw: str, shown: str, stops: list[str]) -> tuple[str, str | None]:
    """Anthropic's stop_reason, and the stop sequence that ended the reply (found where the shown text ends)."""
    if finish == "stop":
        matched = next((s for s in stops if raw.startswith(s, len(shown))), None)
        return "stop_sequence", matched
    if finish in ("length", "context"):
        return "max_tokens", None
    return "end_turn", None


async def messages(server: ServedModel, request: Request, body: MessagesRequest) -> Response:
    """``POST /v1/messages``."""
    served = await server.bind(body.model)
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                               "parameters": t.input_schema}} for t in body.tools or []]
    if (body.tool_choice or {}).get("type") == "none":
        tools = []
    try:
        params = SamplingParams(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p, min_p=0.0,
                                repeat_penalty=1.0)
        ids = await run_in_threadpool(served.model.chat_ids, template_messages_with_calls(_messages(body)), True,
                                      {"tools": tools} if tools else None)
    except ValueError as e:
        raise APIError(400, f"the chat template could not render the messages: {e}", param="messages") from e
    stops = body.stop_sequences or []
    max_tokens = token_budget(served, len(ids), body.max_tokens)
    grammar = forced_tool_grammar(served, tools, _forced_tool(body.tool_choice))
    handle = served.submit(ids, params, max_tokens, stops, grammar)
    message_id = f"msg_{uuid.uuid4().hex}"
    events = served.events(handle, request.is_disconnected)
    if body.stream and not tools:
        return StreamingResponse(_stream(served, events, message_id, len(ids), stops, handle.id),
                                 media_type="text/event-stream")
    if body.stream:
        stream = ToolCallStream()
        return StreamingResponse(_tool_stream(served, events, message_id, len(ids), stops, handle.id, stream),
                                 media_type="text/event-stream")
    reply = _whole_message(served, events, message_id, len(ids), stops, handle.id, bool(tools))
    return JSONResponse((await reply).model_dump())


def _forced_tool(tool_choice: dict | None) -> str | bool:
    """What Anthropic's ``tool_choice`` forces: False (nothing), True (some tool: "any") or a tool's name."""
    kind = (tool_choice or {}).get("type")
    if kind == "any":
        return True
    if kind == "tool":
        if not isinstance(tool_choice.get("name"), str):
            raise APIError(400, "tool_choice of type tool needs a name", param="tool_choice")
        return tool_choice["name"]
    return False


async def _whole_message(served: BoundModel, events: AsyncIterator[GenerationEvent], message_id: str, n_prompt: int,
                         stops: list[str], request_id: int, tools: bool) -> Message:
    """The finished reply; with tools, the calls in it become tool_use blocks."""
    text, tokens, last = [], [], None
    async for event in events:
        text.append(event.text)
        tokens.append(event.id)
        last = event
    shown = "".join(text)
    reason, matched = _stop(last.finish_reason if last else None, served.model.tokenizer.decode(tokens, True),
                            shown, stops)
    _record(served, last, n_prompt, len(tokens), request_id)
    content, calls = parse_tool_calls(shown) if tools else (shown, [])
    blocks: list = [TextBlock(text=content)] if content or not calls else []
    blocks += [ToolUseBlock(id="toolu_" + c.id.removeprefix("call_"), name=c.name, input=c.arguments) for c in calls]
    return Message(id=message_id, model=served.name, content=blocks, stop_reason="tool_use" if calls else reason,
                   stop_sequence=None if calls else matched, usage=_usage(last, n_prompt, len(tokens)))


async def _tool_stream(served: BoundModel, events: AsyncIterator[GenerationEvent], message_id: str, n_prompt: int,
                       stops: list[str], request_id: int, stream: ToolCallStream) -> AsyncIterator[bytes]:
    """A reply with tools, streamed as it is generated: text in text blocks, each tool call a tool_use block
    whose input arrives as ``input_json_delta`` pieces."""
    start = Message(id=message_id, model=served.name, content=[], usage=MessageUsage(input_tokens=n_prompt,
                                                                                      output_tokens=0))
    yield sse.named_event("message_start", {"type": "message_start", "message": start.model_dump()})
    blocks = _Blocks()
    text, tokens, last = [], [], None
    try:
        async for event in events:
            text.append(event.text)
            tokens.append(event.id)
            last = event
            for delta in stream.feed(event.text):
                for item in blocks.events(delta):
                    yield item
        for delta in stream.finish():
            for item in blocks.events(delta):
                yield item
    except APIError as e:
        yield sse.named_event("error", {"type": "error", "error": {"type": "api_error", "message": e.message}})
        return
    for item in blocks.close():
        yield item
    reason, matched = _stop(last.finish_reason if last else None, served.model.tokenizer.decode(tokens, True),
                            "".join(text), stops)
    if stream.calls:
        reason, matched = "tool_use", None
    yield sse.named_event("message_delta", {"type": "message_delta",
                                            "delta": {"stop_reason": reason, "stop_sequence": matched},
                                            "usage": {"output_tokens": len(tokens)}})
    yield sse.named_event("message_stop", {"type": "message_stop"})
    _record(served, last, n_prompt, len(tokens), request_id)


class _Blocks:
    """The content blocks of a streamed message: a text block opened by text, a tool_use block by each call."""

    def __init__(self):
        self.index, self.kind = -1, None  # the open block

    def events(self, delta: CallDelta) -> list[bytes]:
        out = []
        if delta.text:
            if self.kind != "text":
                out += self.close() + self._open({"type": "text", "text": ""}, "text")
            return out + [self._delta({"type": "text_delta", "text": delta.text})]
        if delta.name is not None:
            opening = {"type": "tool_use", "id": "toolu_" + delta.id.removeprefix("call_"), "name": delta.name,
                       "input": {}}
            out += self.close() + self._open(opening, "tool_use")
        if delta.arguments:
            out.append(self._delta({"type": "input_json_delta", "partial_json": delta.arguments}))
        return out

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        self.kind = None
        return [sse.named_event("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _open(self, block: dict, kind: str) -> list[bytes]:
        self.index, self.kind = self.index + 1, kind
        return [sse.named_event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                        "content_block": block})]

    def _delta(self, delta: dict) -> bytes:
        return sse.named_event("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                       "delta": delta})


def _usage(last: GenerationEvent | None, n_prompt: int, n: int) -> MessageUsage:
    cached = last.cached_tokens if last is not None else 0
    return MessageUsage(input_tokens=n_prompt - cached, output_tokens=n, cache_read_input_tokens=cached)


def _record(served: BoundModel, last: GenerationEvent | None, n_prompt: int, n: int, request_id: int) -> None:
    if last is not None:
        served.stats.record(RequestRecord(request_id, "messages", served.name, n_prompt, last.cached_tokens, n,
                                          last.prefill_s, last.decode_tps, last.finish_reason or "cancelled",
                                          time.time()))


async def _stream(served: BoundModel, events: AsyncIterator[GenerationEvent], message_id: str, n_prompt: int,
                  stops: list[str], request_id: int) -> AsyncIterator[bytes]:
    start = Message(id=message_id, model=served.name, content=[], usage=MessageUsage(input_tokens=n_prompt,
                                                                                      output_tokens=0))
    yield sse.named_event("message_start", {"type": "message_start", "message": start.model_dump()})
    yield sse.named_event("content_block_start", {"type": "content_block_start", "index": 0,
                                                  "content_block": {"type": "text", "text": ""}})
    text, tokens, last = [], [], None
    try:
        async for event in events:
            text.append(event.text)
            tokens.append(event.id)
            last = event
            if event.text:
                yield sse.named_event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                              "delta": {"type": "text_delta", "text": event.text}})
    except APIError as e:
        yield sse.named_event("error", {"type": "error", "error": {"type": "api_error", "message": e.message}})
        return
    yield sse.named_event("content_block_stop", {"type": "content_block_stop", "index": 0})
    reason, matched = _stop(last.finish_reason if last else None, served.model.tokenizer.decode(tokens, True),
                            "".join(text), stops)
    yield sse.named_event("message_delta", {"type": "message_delta",
                                            "delta": {"stop_reason": reason, "stop_sequence": matched},
                                            "usage": {"output_tokens": len(tokens)}})
    yield sse.named_event("message_stop", {"type": "message_stop"})
    _record(served, last, n_prompt, len(tokens), request_id)
