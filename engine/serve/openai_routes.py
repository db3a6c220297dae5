"""The OpenAI endpoints: ``/v1/models``, ``/v1/chat/completions`` and ``/v1/completions``, streaming and not."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..generate import GenerationEvent
from ..sampling import SamplingParams
from . import sse
from .errors import APIError
from .host import BoundModel, RequestRecord, ServedModel
from .openai_schemas import (AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest,
                             ChoiceDelta, ChoiceLogprobs, ChunkChoice, Completion, CompletionChoice,
                             CompletionRequest, Model, ModelList, PromptTokensDetails, TokenLogprob, ToolCall,
                             ToolCallFunction, TopLogprob, Usage, _Sampling)
from .logprobs import TopLogprobs
from .tool_calls import CallDelta, ToolCallStream, parse_tool_calls, template_messages_with_calls

# the engine's finish reasons in the OpenAI API's words
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}


def list_models(served: ServedModel) -> JSONResponse:
    """``GET /v1/models``: every model the host can serve (the library, headless with ``--library``)."""
    data = [Model(id=name, created=served.created) for name in served.host.model_ids()]
    return JSONResponse(ModelList(data=data).model_dump())


def sampling_params(body: _Sampling) -> SamplingParams:
    """The engine's sampling parameters for an API request (temperature 0 is greedy)."""
    try:
        return SamplingParams(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p, min_p=body.min_p,
                              repeat_penalty=body.repeat_penalty, presence_penalty=body.presence_penalty,
                              frequency_penalty=body.frequency_penalty, seed=body.seed)
    except ValueError as e:
        raise APIError(400, str(e)) from e


def token_budget(served: BoundModel, n_prompt: int, requested: int | None, param: str = "max_tokens") -> int:
    """The request's token limit: what it asked for, or the rest of the context; 400 when it cannot fit."""
    n_ctx = served.model.n_ctx
    if n_prompt >= n_ctx:
        raise APIError(400, f"the prompt has {n_prompt} tokens; the context holds {n_ctx}", param="messages",
                       code="context_length_exceeded")
    if requested is None:
        return n_ctx - n_prompt
    if n_prompt + requested > n_ctx:
        raise APIError(400, f"{param} {requested} plus the prompt's {n_prompt} tokens exceed the context of "
                            f"{n_ctx} tokens", param=param, code="context_length_exceeded")
    return requested


def _check_common(body: _Sampling) -> None:
    if body.n != 1:
        raise APIError(400, "only n=1 is supported", param="n")
    if len(body.stop_strings()) > 4:
        raise APIError(400, "at most 4 stop sequences are allowed", param="stop")


def _messages(body: ChatCompletionRequest) -> list[dict]:
    """The request's messages as the chat template reads them."""
    out = []
    for message in body.messages:
        role = "system" if message.role == "developer" else message.role
        item = {"role": role, "content": message.text()}
        if message.tool_calls:
            item["tool_calls"] = [call.model_dump() for call in message.tool_calls]
        if message.tool_call_id is not None:
            item["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            item["name"] = message.name
        out.append(item)
    return out


def _response_grammar(response_format: dict | None) -> str | None:
    """The grammar ``response_format`` asks for: None for text, any JSON object, or a JSON schema."""
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    from .constrained import json_schema_grammar  # llguidance loads only when a request needs it

    if kind == "json_object":
        return json_schema_grammar(None)
    spec = response_format.get("json_schema")
    if kind != "json_schema" or not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise APIError(400, "response_format must be text, json_object or json_schema with a 'schema' object",
                       param="response_format")
    try:
        return json_schema_grammar(spec.get("schema", {}))
    except ValueError as e:
        raise APIError(400, str(e), param="response_format", code="invalid_json_schema") from e


def _usage(last: GenerationEvent | None, n_prompt: int, n_generated: int) -> Usage:
    cached = last.cached_tokens if last is not None else 0
    return Usage(prompt_tokens=n_prompt, completion_tokens=n_generated, total_tokens=n_prompt + n_generated,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


def _token_logprob(served: BoundModel, event: GenerationEvent, recorder: TopLogprobs | None = None) -> TokenLogprob:
    """The chosen token's logprob (the engine's own) and, when asked, the step's most likely tokens."""
    decode = served.model.tokenizer.decode
    top = []
    if recorder is not None and event.index < len(recorder.steps):
        top = [TopLogprob(token=decode([tid]), logprob=lp, bytes=list(decode([tid]).encode()))
               for tid, lp in recorder.steps[event.index]]
    piece = decode([event.id])
    return TokenLogprob(token=piece, logprob=event.logprob, bytes=list(piece.encode()), top_logprobs=top)


def _record(served: BoundModel, endpoint: str, last: GenerationEvent | None, n_prompt: int, n: int,
            request_id: int) -> None:
    if last is None:
        return
    served.stats.record(RequestRecord(request_id, endpoint, served.name, n_prompt, last.cached_tokens, n,
                                      last.prefill_s, last.decode_tps, last.finish_reason or "cancelled", time.time()))


async def chat_completions(server: ServedModel, request: Request, body: ChatCompletionRequest) -> Response:
    """``POST /v1/chat/completions``. With ``tools`` the model's own chat template renders them and tool calls in
    the reply come back as ``tool_calls`` (a streamed reply with tools is sent when it is complete)."""
    served = await server.bind(body.model)
    _check_common(body)
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")
    recorder = TopLogprobs(body.top_logprobs) if body.top_logprobs else None
    tools = _tools(body)
    grammar = forced_tool_grammar(served, tools, _forced_tool(body.tool_choice)) or \
        _response_grammar(body.response_format)
    params = sampling_params(body)
    messages = template_messages_with_calls(_messages(body))
    try:
        ids = await run_in_threadpool(served.model.chat_ids, messages, True, {"tools": tools} if tools else None)
    except ValueError as e:  # the template refused the conversation
        raise APIError(400, f"the chat template could not render the messages: {e}", param="messages") from e
    limit_name = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = token_budget(served, len(ids), body.token_limit(), limit_name)
    handle = served.submit(ids, params, max_tokens, body.stop_strings(), grammar, recorder)
    reply_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    events = served.events(handle, request.is_disconnected)
    if body.stream and not tools:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        chunks = _chat_chunks(served, events, reply_id, created, len(ids), body.logprobs, include_usage, handle.id,
                              recorder)
        return StreamingResponse(chunks, media_type="text/event-stream")
    if body.stream:
        stream = ToolCallStream()
        return StreamingResponse(_tool_chunks(served, body, events, reply_id, created, len(ids), handle.id, stream),
                                 media_type="text/event-stream")
    reply = await _chat_reply(served, body, events, reply_id, created, len(ids), handle.id, bool(tools),
                              recorder)
    return JSONResponse(reply.model_dump(exclude_none=False))


def _forced_tool(tool_choice: str | dict | None) -> str | bool:
    """What OpenAI's ``tool_choice`` forces: False (nothing), True (some tool: "required") or a tool's name."""
    if tool_choice == "required":
        return True
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        if tool_choice.get("type") != "function" or not isinstance(function, dict) \
                or not isinstance(function.get("name"), str):
            raise APIError(400, "tool_choice must be none, auto, required or {'type': 'function', 'function': "
                                "{'name': ...}}", param="tool_choice")
        return function["name"]
    if tool_choice not in (None, "auto", "none"):
        raise APIError(400, "tool_choice must be none, auto, required or a function", param="tool_choice")
    return False


def forced_tool_grammar(served: BoundModel, tools: list[dict] | None, forced: str | bool) -> str | None:
    """The grammar that makes the reply one call of the forced tool (any tool when ``forced`` is True), in the
    syntax of the model's chat template; None when no tool is forced."""
    if forced is False:
        return None
    if not tools:
        raise APIError(400, "tool_choice forces a tool call but the request has no tools", param="tool_choice")
    from .constrained import tool_call_grammar  # llguidance loads only when a request needs it
    try:
        return tool_call_grammar(tools, None if forced is True else forced, served.model.template.source)
    except ValueError as e:
        raise APIError(400, str(e), param="tool_choice") from e


def _tools(body: ChatCompletionRequest) -> list[dict] | None:
    """The request's function tools for the template, checked; None when there are none or tool_choice is none."""
    if not body.tools or body.tool_choice == "none":
        return None
    for i, tool in enumerate(body.tools):
        function = tool.get("function")
        if tool.get("type") != "function" or not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise APIError(400, "each tool must be {'type': 'function', 'function': {'name': ...}}",
                           param=f"tools.{i}")
    return body.tools


async def _chat_reply(served: BoundModel, body: ChatCompletionRequest, events: AsyncIterator[GenerationEvent],
                      reply_id: str, created: int, n_prompt: int, request_id: int, tools: bool,
                      recorder: TopLogprobs | None = None) -> ChatCompletion:
    text, logprobs, last, n = [], [], None, 0
    async for event in events:
        text.append(event.text)
        n, last = n + 1, event
        if body.logprobs:
            logprobs.append(_token_logprob(served, event, recorder))
    _record(served, "chat", last, n_prompt, n, request_id)
    content, calls = parse_tool_calls("".join(text)) if tools else ("".join(text), [])
    finish = FINISH[last.finish_reason] if last is not None else "stop"
    message = AssistantMessage(content="".join(text))
    if calls:
        finish, message = "tool_calls", AssistantMessage(content=content or None, tool_calls=[
            ToolCall(id=c.id, function=ToolCallFunction(name=c.name, arguments=json.dumps(c.arguments)))
            for c in calls])
    choice = ChatChoice(message=message, finish_reason=finish,
                        logprobs=ChoiceLogprobs(content=logprobs) if body.logprobs else None)
    return ChatCompletion(id=reply_id, created=created, model=served.name, choices=[choice],
                          usage=_usage(last, n_prompt, n))


async def _tool_chunks(served: BoundModel, body: ChatCompletionRequest, events: AsyncIterator[GenerationEvent],
                       reply_id: str, created: int, n_prompt: int, request_id: int,
                       stream: ToolCallStream) -> AsyncIterator[bytes]:
    """A reply with tools, streamed as it is generated: text as content deltas, each tool call as
    ``delta.tool_calls`` (its id and name first, then its arguments in pieces), then the finish and [DONE]."""
    def chunk(delta: ChoiceDelta, finish: str | None = None) -> bytes:
        data = ChatCompletionChunk(id=reply_id, created=created, model=served.name,
                                   choices=[ChunkChoice(delta=delta, finish_reason=finish)])
        return sse.data_event(data.model_dump(exclude_none=True))

    yield chunk(ChoiceDelta(role="assistant", content=""))
    last, n = None, 0
    try:
        async for event in events:
            n, last = n + 1, event
            for delta in stream.feed(event.text):
                yield chunk(_call_delta(delta))
    except APIError as e:  # mid-stream: the status is sent already, so the error goes in the stream
        yield sse.data_event({"error": {"message": e.message, "type": "server_error", "param": None, "code": e.code}})
        return
    for delta in stream.finish():
        yield chunk(_call_delta(delta))
    finish = "tool_calls" if stream.calls else FINISH[last.finish_reason] if last is not None else "stop"
    yield chunk(ChoiceDelta(), finish)
    if body.stream_options is not None and body.stream_options.include_usage:
        data = ChatCompletionChunk(id=reply_id, created=created, model=served.name, choices=[],
                                   usage=_usage(last, n_prompt, n))
        yield sse.data_event(data.model_dump(exclude_none=True))
    _record(served, "chat", last, n_prompt, n, request_id)
    yield sse.DONE


def _call_delta(delta: CallDelta) -> ChoiceDelta:
    if delta.text:
        return ChoiceDelta(content=delta.text)
    call = {"index": delta.index, "function": {"arguments": delta.arguments}}
    if delta.name is not None:
        call.update(id=delta.id, type="function", function={"name": delta.name, "arguments": delta.arguments})
    return ChoiceDelta(tool_calls=[call])


async def _chat_chunks(served: BoundModel, events: AsyncIterator[GenerationEvent], reply_id: str, created: int,
                       n_prompt: int, logprobs: bool, include_usage: bool, request_id: int,
                       recorder: TopLogprobs | None = None) -> AsyncIterator[bytes]:
    def chunk(delta: ChoiceDelta, finish: str | None = None, lp: ChoiceLogprobs | None = None) -> bytes:
        data = ChatCompletionChunk(id=reply_id, created=created, model=served.name,
                                   choices=[ChunkChoice(delta=delta, finish_reason=finish, logprobs=lp)])
        return sse.data_event(data.model_dump(exclude_none=True))

    yield chunk(ChoiceDelta(role="assistant", content=""))
    last, n = None, 0
    try:
        async for event in events:
            n, last = n + 1, event
            lp = ChoiceLogprobs(content=[_token_logprob(served, event, recorder)]) if logprobs else None
            if event.text or lp is not None:
                yield chunk(ChoiceDelta(content=event.text), lp=lp)
    except APIError as e:  # mid-stream: the status is sent already, so the error goes in the stream
        yield sse.data_event({"error": {"message": e.message, "type": "server_error", "param": None, "code": e.code}})
        return
    yield chunk(ChoiceDelta(), FINISH[last.finish_reason] if last is not None else "stop")
    if include_usage:
        data = ChatCompletionChunk(id=reply_id, created=created, model=served.name, choices=[],
                                   usage=_usage(last, n_prompt, n))
        yield sse.data_event(data.model_dump(exclude_none=True))
    _record(served, "chat", last, n_prompt, n, request_id)
    yield sse.DONE


async def completions(server: ServedModel, request: Request, body: CompletionRequest) -> Response:
    """``POST /v1/completions``: a plain text prompt (or token ids) continued. ``logprobs`` N gives each
    generated token's logprob (the engine's own) and the N most likely tokens of its step, in the legacy format;
    ``return_token_ids`` adds the prompt's and the completion's token ids to the choice."""
    served = await server.bind(body.model)
    _check_common(body)
    params = sampling_params(body)
    if isinstance(body.prompt, str):
        ids = await run_in_threadpool(served.model.tokenize, body.prompt, True, True)
    else:
        n_vocab = served.model.tokenizer.n_vocab
        if any(not 0 <= t < n_vocab for t in body.prompt):
            raise APIError(400, f"prompt token ids must be in [0, {n_vocab})", param="prompt")
        ids = list(body.prompt)
    if not ids:
        raise APIError(400, "the prompt is empty", param="prompt")
    max_tokens = token_budget(served, len(ids), body.max_tokens)
    recorder = TopLogprobs(body.logprobs) if body.logprobs else None
    handle = served.submit(ids, params, max_tokens, body.stop_strings(), top_logprobs=recorder)
    reply_id, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    events = served.events(handle, request.is_disconnected)
    echo = (body.prompt if isinstance(body.prompt, str) else served.model.detokenize(ids)) if body.echo else ""
    pieces = CompletionPieces(served, body, ids, echo, recorder)
    if body.stream:
        return StreamingResponse(_completion_chunks(served, events, reply_id, created, pieces, handle.id),
                                 media_type="text/event-stream")
    last, n = None, 0
    async for event in events:
        pieces.add(event)
        n, last = n + 1, event
    _record(served, "completions", last, len(ids), n, handle.id)
    choice = pieces.choice("".join([echo, *pieces.text]), FINISH[last.finish_reason] if last else "stop", whole=True)
    reply = Completion(id=reply_id, created=created, model=served.name, choices=[choice],
                       usage=_usage(last, len(ids), n))
    return JSONResponse(_without_token_ids(reply.model_dump()))


class CompletionPieces:
    """A completion's text, token ids and legacy logprobs (``tokens``, ``token_logprobs``, ``top_logprobs``,
    ``text_offset``) as its tokens arrive."""

    def __init__(self, served: BoundModel, body: CompletionRequest, ids: list[int], echo: str,
                 recorder: TopLogprobs | None):
        self.served, self.body, self.prompt_ids, self.recorder, self.echo = served, body, ids, recorder, echo
        self.text: list[str] = []
        self.ids: list[int] = []
        self.offset = len(echo)
        self.logprobs = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

    def add(self, event: GenerationEvent) -> dict | None:
        """Take one token; its logprobs entry (one token's lists) when logprobs were asked for."""
        self.text.append(event.text)
        self.ids.append(event.id)
        if self.body.logprobs is None:
            return None
        decode = self.served.model.tokenizer.decode
        top = {}
        if self.recorder is not None and event.index < len(self.recorder.steps):
            top = {decode([tid]): lp for tid, lp in self.recorder.steps[event.index]}
        one = {"tokens": [decode([event.id])], "token_logprobs": [event.logprob],
               "top_logprobs": [top] if self.body.logprobs else [None], "text_offset": [self.offset]}
        self.offset += len(event.text)
        for key, values in one.items():
            self.logprobs[key] += values
        return one

    def choice(self, text: str, finish: str | None, whole: bool = False, one: dict | None = None) -> CompletionChoice:
        """A choice with ``text``; the whole reply's logprobs and ids (``whole``) or one token's (``one``)."""
        ids = self.body.return_token_ids
        return CompletionChoice(text=text, finish_reason=finish,
                                logprobs=self.logprobs if whole and self.body.logprobs is not None else one,
                                prompt_token_ids=self.prompt_ids if ids and whole else None,
                                token_ids=list(self.ids) if ids and whole else None)


def _without_token_ids(data: dict) -> dict:
    """Leave the token-id extension fields out of a response that did not ask for them."""
    for choice in data.get("choices", []):
        for key in ("prompt_token_ids", "token_ids"):
            if choice.get(key) is None:
                choice.pop(key, None)
    return data


async def _completion_chunks(served: BoundModel, events: AsyncIterator[GenerationEvent], reply_id: str,
                             created: int, pieces: CompletionPieces, request_id: int) -> AsyncIterator[bytes]:
    def chunk(choice: CompletionChoice) -> bytes:
        data = Completion(id=reply_id, created=created, model=served.name, choices=[choice])
        return sse.data_event(data.model_dump(exclude_none=True))

    if pieces.echo:
        yield chunk(CompletionChoice(text=pieces.echo, finish_reason=None))
    last, n = None, 0
    try:
        async for event in events:
            n, last = n + 1, event
            one = pieces.add(event)
            if event.text or one is not None:
                yield chunk(pieces.choice(event.text, None, one=one))
    except APIError as e:
        yield sse.data_event({"error": {"message": e.message, "type": "server_error", "param": None, "code": e.code}})
        return
    final = pieces.choice("", FINISH[last.finish_reason] if last is not None else "stop")
    if pieces.body.return_token_ids:
        final.prompt_token_ids, final.token_ids = pieces.prompt_ids, list(pieces.ids)
    yield chunk(final)
    _record(served, "completions", last, len(pieces.prompt_ids), n, request_id)
    yield sse.DONE
