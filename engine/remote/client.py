"""RemoteClient: list an endpoint's models, probe what it supports, and stream a chat reply over OpenAI's protocol.

Requests and stream chunks are the API server's own pydantic models (``engine/serve/openai_schemas.py``), so the
client and ``hearth serve`` read and write one schema. Every failure is a typed ``RemoteError``; a 429 is retried
after its ``Retry-After`` (bounded), a stalled or closed stream ends with what arrived so far marked partial.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator

import httpx
from pydantic import ValidationError

from ..serve.openai_schemas import ChatCompletionChunk, ChatCompletionRequest, Usage
from .endpoint import Endpoint
from .errors import (AuthenticationFailed, EndpointUnreachable, MalformedStream, ModelNotFound, RateLimited,
                     RemoteError, RequestRejected, ServerError, StreamStalled, TruncatedStream)

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                   "repeat_penalty", "seed", "stop")
PROBE_TOOL = {"type": "function", "function": {"name": "probe", "description": "Capability probe.",
                                               "parameters": {"type": "object", "properties": {}}}}
PROBE_SCHEMA = {"type": "json_schema", "json_schema": {"name": "probe", "schema": {"type": "object"}}}


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What an endpoint accepted for a model when probed with one-token requests."""

    streaming: bool = False
    tools: bool = False
    json_schema: bool = False
    logprobs: bool = False
    anthropic_messages: bool = False

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Capabilities:
        return cls(**{f.name: bool(data.get(f.name, False)) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class StreamChunk:
    """Text of one stream chunk; the last one has ``finish_reason``, and ``usage`` when the server sent it."""

    text: str
    finish_reason: str | None = None
    usage: Usage | None = None
    reasoning: str = ""  # the model's thinking, which servers that split it send apart from the answer


class RemoteClient:
    """Talks to one ``Endpoint``; safe to use from one thread at a time per call (each call opens its client).

    Args:
        endpoint: where and how.
        sleep: waits between retries as ``sleep(seconds, cancel)``; True when cancelled meanwhile.
    """

    def __init__(self, endpoint: Endpoint, sleep: Callable[[float, threading.Event | None], bool] | None = None):
        self.endpoint = endpoint
        self._sleep = sleep or _wait

    def list_models(self) -> list[str]:
        """The ids ``GET /v1/models`` lists.

        Raises:
            RemoteError: a typed failure (unreachable, 401/403, 404, 5xx, a body that is not a model list).
        """
        with self.endpoint.http_client() as http:
            response = self._send(http, "GET", self.endpoint.api_url + "/models")
        try:  # only the ids: servers differ in the other fields (llama-server, Ollama, vLLM)
            return [str(m["id"]) for m in response.json()["data"]]
        except (ValueError, KeyError, TypeError) as e:
            raise MalformedStream(f"The server at {self.endpoint.root} did not answer /v1/models with a model "
                                  f"list ({e})") from None

    def probe(self, model: str) -> Capabilities:
        """Ask ``model`` for one token in each way Hearth may use; a refused way is reported as unsupported.

        Raises:
            RemoteError: the endpoint cannot be reached, refuses the key, or does not serve ``model``.
        """
        base = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        streaming = self._accepted({**base, "stream": True}, stream=True)
        tools = self._accepted({**base, "tools": [PROBE_TOOL]})
        schema = self._accepted({**base, "response_format": PROBE_SCHEMA})
        logprobs = self._accepted({**base, "logprobs": True}, check=lambda body: bool(
            body.get("choices") and (body["choices"][0].get("logprobs") or {}).get("content")))
        messages = self._accepted(base, path="/messages", check=lambda body: body.get("type") == "message")
        return Capabilities(streaming, tools, schema, logprobs, messages)

    def stream_chat(self, model: str, messages: list[dict], max_tokens: int, sampling: dict | None = None,
                    cancel: threading.Event | None = None,
                    on_open: Callable[[httpx.Response], None] | None = None) -> Iterator[StreamChunk]:
        """Stream a chat reply from ``POST /v1/chat/completions``.

        Args:
            model: the remote model's id.
            messages: OpenAI chat messages.
            max_tokens: most tokens in the reply.
            sampling: temperature, top_p, top_k, min_p, penalties, seed, stop (others are ignored).
            cancel: set to stop; checked between chunks and while waiting to retry.
            on_open: called with the open response, so another thread can close it (Stop while the server
                is silent); the server then sees the disconnect.
        Yields:
            StreamChunk per chunk with text or an end; the last one has finish_reason.
        Raises:
            RemoteError: typed; ``partial`` is True when text had been yielded before it.
        """
        body = chat_request(model, messages, max_tokens, sampling)
        with self.endpoint.http_client() as http:
            response = self._open_stream(http, body, cancel)
            try:
                if on_open is not None:
                    on_open(response)
                yield from self._read_stream(response, cancel)
            finally:
                response.close()

    # -- internals ---------------------------------------------------------------------------------
    def _open_stream(self, http: httpx.Client, body: dict, cancel: threading.Event | None):
        """The streaming response once it answered 200; 429 retried after Retry-After, at most max_retries."""
        url = self.endpoint.api_url + "/chat/completions"
        for attempt in range(self.endpoint.max_retries + 1):
            request = http.build_request("POST", url, json=body)
            try:
                response = http.send(request, stream=True)
            except httpx.HTTPError as e:
                raise self._transport_error(e) from None
            if response.status_code == 200:
                return response
            response.read()
            response.close()
            error = self._status_error(response)
            if not isinstance(error, RateLimited) or attempt == self.endpoint.max_retries:
                raise error
            delay = error.retry_after_s if error.retry_after_s is not None else min(2.0 ** attempt, 8.0)
            if delay > self.endpoint.max_retry_wait_s:
                raise error
            if self._sleep(delay, cancel):
                raise RemoteError("Stopped while waiting to retry.")
        raise AssertionError("unreachable")

    def _read_stream(self, response: httpx.Response, cancel: threading.Event | None) -> Iterator[StreamChunk]:
        partial, ended = False, False
        try:
            for data in sse_data(response.iter_lines()):
                if cancel is not None and cancel.is_set():
                    return
                if data == "[DONE]":
                    ended = True
                    break
                chunk = self._parse_chunk(data, partial)
                partial = partial or bool(chunk.text)
                ended = ended or chunk.finish_reason is not None
                if chunk.text or chunk.reasoning or chunk.finish_reason or chunk.usage:
                    yield chunk
        except httpx.ReadTimeout:
            raise StreamStalled(f"The server at {self.endpoint.root} sent nothing for "
                                f"{self.endpoint.stall_timeout_s:g} s; the answer was cut off there.",
                                partial) from None
        except httpx.HTTPError as e:
            if cancel is not None and cancel.is_set():
                return  # Stop closed the response under the read
            raise TruncatedStream(f"The connection to {self.endpoint.root} broke mid-answer "
                                  f"({type(e).__name__}).", partial) from None
        if not ended and not (cancel is not None and cancel.is_set()):
            raise TruncatedStream(f"The server at {self.endpoint.root} closed the stream before the answer ended.",
                                  partial)

    def _parse_chunk(self, data: str, partial: bool) -> StreamChunk:
        try:
            payload = json.loads(data)
            if isinstance(payload, dict) and "error" in payload and "choices" not in payload:
                raise ServerError(f"The server at {self.endpoint.root} reported an error mid-answer: "
                                  f"{_error_message(payload)}", partial)
            chunk = ChatCompletionChunk.model_validate(payload)
        except (ValueError, ValidationError) as e:
            raise MalformedStream(f"The server at {self.endpoint.root} sent a stream Hearth cannot read "
                                  f"({_first_line(e)}).", partial) from None
        choice = chunk.choices[0] if chunk.choices else None
        text = (choice.delta.content or "") if choice else ""
        return StreamChunk(text, choice.finish_reason if choice else None, chunk.usage, _reasoning(payload))

    def _accepted(self, body: dict, stream: bool = False, path: str = "/chat/completions",
                  check: Callable[[dict], bool] | None = None) -> bool:
        """True when the endpoint answers ``body`` with 200 (and ``check`` holds for the JSON body)."""
        with self.endpoint.http_client() as http:
            try:
                response = self._send(http, "POST", self.endpoint.api_url + path, json=body)
            except (RequestRejected, ModelNotFound, ServerError) as e:
                if isinstance(e, ModelNotFound) and path == "/chat/completions":
                    raise
                return False
        if stream:
            return "data:" in response.text
        try:
            return check(response.json()) if check else True
        except ValueError:
            return False

    def _send(self, http: httpx.Client, method: str, url: str, **kwargs) -> httpx.Response:
        try:
            response = http.request(method, url, **kwargs)
        except httpx.HTTPError as e:
            raise self._transport_error(e) from None
        if response.status_code >= 400:
            raise self._status_error(response)
        return response

    def _transport_error(self, e: httpx.HTTPError) -> RemoteError:
        if isinstance(e, httpx.TimeoutException) and not isinstance(e, httpx.ConnectTimeout):
            return StreamStalled(f"The server at {self.endpoint.root} did not answer within "
                                 f"{self.endpoint.stall_timeout_s:g} s.")
        detail = str(e).split("\n")[0] or type(e).__name__
        if "CERTIFICATE_VERIFY_FAILED" in str(e):
            detail += "; if this server's self-signed certificate is expected, turn on 'allow self-signed'"
        return EndpointUnreachable(f"Cannot reach {self.endpoint.root}: {detail}.")

    def _status_error(self, response: httpx.Response) -> RemoteError:
        status, root = response.status_code, self.endpoint.root
        message = _error_message(_json_or_none(response)) or response.reason_phrase
        if status in (401, 403):
            return AuthenticationFailed(f"The server at {root} refused the API key ({status}: {message}). Check the "
                                        "key set for this endpoint.")
        if status == 404:
            return ModelNotFound(f"The server at {root} does not serve this model or path (404: {message}).")
        if status == 429:
            retry_after = _retry_after(response.headers.get("retry-after"))
            return RateLimited(f"The server at {root} is busy (429: {message}); it still was after "
                               f"{self.endpoint.max_retries} retries.", retry_after)
        if status >= 500:
            return ServerError(f"The server at {root} failed to answer ({status}: {message}).")
        return RequestRejected(f"The server at {root} refused the request ({status}: {message}).")


def chat_request(model: str, messages: list[dict], max_tokens: int, sampling: dict | None = None) -> dict:
    """The JSON body of a streaming chat request, validated by the API server's own request model."""
    fields = {k: v for k, v in (sampling or {}).items() if k in SAMPLING_FIELDS and v is not None}
    if fields.get("stop") == [] or fields.get("stop") == ():
        fields.pop("stop")
    request = ChatCompletionRequest(model=model, messages=messages, max_tokens=max_tokens, stream=True,
                                    stream_options={"include_usage": True}, **fields)
    return request.model_dump(mode="json", exclude_unset=True, exclude_none=True)


def sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The data of each server-sent event (its ``data:`` lines joined); comments and other fields are skipped."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield "\n".join(data)


def _wait(seconds: float, cancel: threading.Event | None) -> bool:
    if cancel is None:
        time.sleep(seconds)
        return False
    return cancel.wait(seconds)


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to backoff


def _json_or_none(response: httpx.Response):
    try:
        return response.json()
    except ValueError:
        return None


def _error_message(body) -> str:
    """The message of an OpenAI (``{"error": {"message"}}``) or Anthropic error body, or ''."""
    if not isinstance(body, dict):
        return ""
    error = body.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error.get("type") or "")
    if isinstance(error, str):
        return error
    return str(body.get("message") or body.get("detail") or "")


def _reasoning(payload: dict) -> str:
    """The thinking text of a chunk: ``reasoning_content`` (llama-server, vLLM, DeepSeek's API) or ``reasoning``
    (newer vLLM, Ollama); not part of OpenAI's schema, so read from the raw chunk."""
    choices = payload.get("choices") or []
    delta = choices[0].get("delta") if choices and isinstance(choices[0], dict) else None
    if not isinstance(delta, dict):
        return ""
    value = delta.get("reasoning_content") or delta.get("reasoning") or ""
    return value if isinstance(value, str) else ""


def _first_line(e: Exception) -> str:
    return str(e).strip().split("\n")[0][:200]

