"""Pydantic models of the Anthropic Messages API's request, response and stream events (the fields Hearth serves)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Request):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(b.text for b in self.content)


class InputText(_Request):
    type: Literal["text"]
    text: str


class InputToolUse(_Request):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


Block = InputText | InputToolUse | ToolResultBlock


class MessageParam(_Request):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(_Request):
    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    input_schema: dict[str, Any]


class MessagesRequest(_Request):
    """``POST /v1/messages``."""

    model: str
    max_tokens: int = Field(ge=1)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[InputText] | None = None
    stop_sequences: list[str] | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=1.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    stream: bool = False
    tools: list[Tool] | None = None
    tool_choice: dict[str, Any] | None = None

    def system_text(self) -> str:
        if isinstance(self.system, list):
            return "".join(block.text for block in self.system)
        return self.system or ""


class MessageUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class Message(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextBlock | ToolUseBlock]
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: MessageUsage
