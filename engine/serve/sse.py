"""Server-sent events: the wire encoding of streamed chunks (OpenAI's ``data:`` lines, Anthropic's named events)."""

from __future__ import annotations

import json

DONE = b"data: [DONE]\n\n"  # OpenAI's end-of-stream marker


def data_event(payload: dict) -> bytes:
    """One ``data:`` event holding ``payload`` as compact JSON."""
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def named_event(name: str, payload: dict) -> bytes:
    """One event with an ``event:`` name line, as the Anthropic Messages stream sends them."""
    return f"event: {name}\n".encode() + data_event(payload)
