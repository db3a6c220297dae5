"""Syntax colours for code blocks: Pygments lexes the code and a light or dark Pygments style colours the tokens."""

from __future__ import annotations

import dataclasses
import functools

from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.style import StyleMeta
from pygments.styles import get_style_by_name
from pygments.util import ClassNotFound

STYLES = {False: "default", True: "github-dark"}  # Pygments style for a light and for a dark window
MAX_HIGHLIGHT_CHARS = 200_000  # a larger block stays plain: the reply's text is the model's, its size unbounded


@dataclasses.dataclass(frozen=True)
class CodeSpan:
    """``length`` characters from ``start`` (in the code's text) drawn in ``color`` (#rrggbb)."""

    start: int
    length: int
    color: str
    bold: bool = False
    italic: bool = False


def code_spans(code: str, language: str, dark: bool) -> list[CodeSpan]:
    """Coloured spans of ``code`` in order; empty when the language is unknown or missing (no guessing)."""
    lexer = _lexer(language.strip().lower())
    if lexer is None or len(code) > MAX_HIGHLIGHT_CHARS:
        return []
    style = _style(dark)
    spans, position = [], 0
    for token, text in lexer.get_tokens(code):
        look = style.style_for_token(token)
        if look["color"] and text.strip():
            span = CodeSpan(position, len(text), f"#{look['color']}", bool(look["bold"]), bool(look["italic"]))
            last = spans[-1] if spans else None
            if last and last.start + last.length == position and (last.color, last.bold, last.italic) == \
                    (span.color, span.bold, span.italic):
                span = dataclasses.replace(last, length=last.length + span.length)  # one span per string, comment
                spans.pop()
            spans.append(span)
        position += len(text)
    return spans


@functools.lru_cache(maxsize=64)
def _lexer(language: str) -> Lexer | None:
    if not language:
        return None
    try:
        # keep the text exactly as given, so the spans' offsets are offsets into it
        return get_lexer_by_name(language, stripnl=False, stripall=False, ensurenl=False, tabsize=0)
    except ClassNotFound:
        return None


@functools.lru_cache(maxsize=2)
def _style(dark: bool) -> StyleMeta:
    return get_style_by_name(STYLES[dark])
