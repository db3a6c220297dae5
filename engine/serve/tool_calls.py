"""Tool calls in model output, parsed back into structured calls: one small parser per model family's syntax.

Supported: Qwen/Hermes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, Mistral's
``[TOOL_CALLS][{...}]`` and Llama 3's bare JSON object ``{"name": ..., "parameters": {...}}``. The model's own
chat template renders the tool definitions; these parsers only read what it wrote back. Nothing is executed.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_MISTRAL = "[TOOL_CALLS]"


@dataclasses.dataclass(frozen=True)
class ParsedToolCall:
    """One call: the function's name and its arguments (a JSON object)."""

    name: str
    arguments: dict
    id: str = dataclasses.field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


def _call_from(obj: object) -> ParsedToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    return ParsedToolCall(obj["name"], arguments) if isinstance(arguments, dict) else None


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def parse_tool_calls(text: str) -> tuple[str, list[ParsedToolCall]]:
    """Split a reply into its plain text and the tool calls in it (none when it holds no well-formed call).

    Returns:
        The text outside the calls (stripped) and the calls in order.
    """
    if "<tool_call>" in text:
        calls = [_call_from(_loads(body)) for body in _HERMES.findall(text)]
        if calls and all(calls):
            return _HERMES.sub("", text).strip(), calls
        return text, []
    if _MISTRAL in text:
        before, _, after = text.partition(_MISTRAL)
        items = _loads(after.strip())
        items = items if isinstance(items, list) else [items]
        calls = [_call_from(item) for item in items]
        return (before.strip(), calls) if calls and all(calls) else (text, [])
    stripped = text.strip()
    if stripped.startswith("{") and stripped.endswith("}"):
        call = _call_from(_loads(stripped))
        if call is not None and set(_loads(stripped)) <= {"name", "arguments", "parameters", "type"}:
            return "", [call]
    return text, []


def template_messages_with_calls(messages: list[dict]) -> list[dict]:
    """Messages for the chat template: tool-call arguments as objects (templates write them with ``tojson``)."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            message = {**message, "tool_calls": [
                {**call, "function": {**call["function"], "arguments": _arguments_object(call["function"]["arguments"])}}
                for call in calls]}
        out.append(message)
    return out


def _arguments_object(arguments: object) -> object:
    if isinstance(arguments, str):
        parsed = _loads(arguments)
        return parsed if isinstance(parsed, dict) else arguments
    return arguments


_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


@dataclasses.dataclass(frozen=True)
class CallDelta:
    """A piece of a streaming reply: ``text`` outside calls, or call ``index``'s start (``name`` and ``id``) or
    a piece of its ``arguments`` (JSON text; a call's pieces joined are its arguments object)."""

    text: str = ""
    index: int = -1
    name: str | None = None
    id: str | None = None
    arguments: str = ""


class ToolCallStream:
    """Splits a reply into text and tool calls as its pieces arrive, for ``delta.tool_calls`` and Anthropic's
    ``input_json_delta``: text goes out at once (less a tail that may open a call), a call's start as soon as its
    name is complete, and its arguments in pieces (less a tail that may be the call's closing brace).

    Hermes/Qwen ``<tool_call>`` blocks anywhere, and with ``bare_json`` a reply that is one JSON object
    ``{"name": ..., "arguments": ...}`` (Llama 3's syntax, a forced call without ``<tool_call>``, and Qwen's
    blocks when its ``<tool_call>`` control tokens are left out of the text).
    """

    def __init__(self, bare_json: bool = True):
        self.calls = 0
        self._buffer, self._state = "", "start" if bare_json else "text"  # text | head | arguments

    def feed(self, text: str) -> list[CallDelta]:
        self._buffer += text
        out: list[CallDelta] = []
        while True:
            before = (self._state, len(self._buffer))
            out += self._advance()
            if (self._state, len(self._buffer)) == before:
                return [d for d in out if d.text or d.name or d.arguments]

    def finish(self) -> list[CallDelta]:
        """What is left at the end of the reply (an unclosed call ends with it)."""
        out, rest, self._buffer = [], self._buffer, ""
        if self._state == "arguments":
            out.append(CallDelta(index=self.calls - 1, arguments=_without_outer_brace(rest)))
        elif self._state == "head":
            call = _call_from(_loads(rest.strip()))
            out += self._whole_call(call) if call else [CallDelta(text=rest)]
        elif rest:
            out.append(CallDelta(text=rest))
        return [d for d in out if d.text or d.name or d.arguments]

    def _advance(self) -> list[CallDelta]:
        buffer = self._buffer
        if self._state == "start":
            if not buffer.strip():
                return []
            self._state = "head" if buffer.lstrip().startswith("{") else "text"
            return []
        if self._state == "text":
            if _OPEN in buffer:
                before, _, self._buffer = buffer.partition(_OPEN)
                self._state = "head"
                return [CallDelta(text=before)]
            keep = _partial_suffix(buffer, _OPEN)
            self._buffer = buffer[len(buffer) - keep:]
            return [CallDelta(text=buffer[:len(buffer) - keep])]
        if self._state == "head":
            if _CLOSE in buffer:  # a call whose name does not come first: sent whole
                body, _, self._buffer = buffer.partition(_CLOSE)
                self._state = "text"
                call = _call_from(_loads(body.strip()))
                return self._whole_call(call) if call else [CallDelta(text=_OPEN + body + _CLOSE)]
            head = _HEAD.match(buffer)
            if head is None:
                return []
            self._buffer, self._state = buffer[head.end():], "arguments"
            self.calls += 1
            return [CallDelta(index=self.calls - 1, name=json.loads(f'"{head.group(1)}"'),
                              id=f"call_{uuid.uuid4().hex[:24]}")]
        if _CLOSE in buffer:
            body, _, self._buffer = buffer.partition(_CLOSE)
            self._state = "text"
            return [CallDelta(index=self.calls - 1, arguments=_without_outer_brace(body))]
        keep = len(buffer) - buffer.rfind("}") if "}" in buffer else _partial_suffix(buffer, _CLOSE)
        self._buffer = buffer[len(buffer) - keep:]
        return [CallDelta(index=self.calls - 1, arguments=buffer[:len(buffer) - keep])]

    def _whole_call(self, call: ParsedToolCall) -> list[CallDelta]:
        self.calls += 1
        return [CallDelta(index=self.calls - 1, name=call.name, id=call.id),
                CallDelta(index=self.calls - 1, arguments=json.dumps(call.arguments))]


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _without_outer_brace(body: str) -> str:
    """A call's text after ``"arguments":``, less the closing brace of the call object around it."""
    body = body.rstrip()
    return body[:-1].rstrip() if body.endswith("}") else body
