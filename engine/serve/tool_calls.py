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
