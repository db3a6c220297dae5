"""Split Markdown into prose and fenced code blocks, so code can get its own view with a copy button."""

from __future__ import annotations

import dataclasses
import re

FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*([^`\s]*)")


@dataclasses.dataclass(frozen=True)
class Block:
    kind: str  # "text" (Markdown prose) or "code"
    text: str
    language: str = ""
    closed: bool = True  # False for a code block whose closing fence has not streamed in yet


def split_blocks(markdown: str) -> list[Block]:
    """Prose and code blocks in order; a fence left open (a reply still streaming) runs to the end."""
    blocks: list[Block] = []
    lines: list[str] = []
    fence, language = None, ""
    for line in markdown.split("\n"):
        if fence is None:
            match = FENCE_OPEN.match(line)
            if match and not (match.group(1)[0] == "`" and "`" in line[match.end(1):]):
                _add_text(blocks, lines)
                fence, language, lines = match.group(1), match.group(2), []
            else:
                lines.append(line)
        elif _closes(line, fence):
            blocks.append(Block("code", "\n".join(lines), language))
            fence, lines = None, []
        else:
            lines.append(line)
    if fence is not None:
        blocks.append(Block("code", "\n".join(lines), language, closed=False))
    else:
        _add_text(blocks, lines)
    return blocks


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return len(stripped) >= len(fence) and set(stripped) == {fence[0]} and len(line) - len(line.lstrip(" ")) <= 3


def _add_text(blocks: list[Block], lines: list[str]) -> None:
    text = "\n".join(lines).strip("\n")
    if text.strip():
        blocks.append(Block("text", text))
