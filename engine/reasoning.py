"""Reasoning ("thinking") in a reply: split the generated text into thinking and answer, as it streams.

Three syntaxes are understood:

* ``think``: Qwen3, QwQ, SmolLM3, DeepSeek-R1 distills write ``<think>…</think>`` before the answer. Some templates
  put ``<think>`` at the end of the prompt (Qwen3.5, QwQ), so the reply starts inside the thinking and only closes
  it; a ``</think>`` with no ``<think>`` before it therefore turns everything before it into thinking.
* ``mistral``: Magistral and Ministral 3 Reasoning write ``[THINK]…[/THINK]``, the same way. Those markers are
  control tokens, which a reply's text leaves out unless the vocabulary preserves them (``engine.vocab`` does when
  the chat template uses them, as llama.cpp's server does).
* ``harmony``: gpt-oss writes messages ``<|channel|>NAME<|message|>TEXT<|end|>`` (the last one ends at
  ``<|return|>``, an end-of-generation token the decoder leaves out); the ``analysis`` channel is thinking, the
  others (``final``, ``commentary``) are answer. Headers such as ``<|start|>assistant`` are dropped.

The splitter is incremental: text can arrive in any pieces, a marker split across pieces is held back until it is
whole, and a reply that never closes its thinking is all thinking. ``ReasoningProfile`` says which syntax a chat
template uses, whether it has an ``enable_thinking`` switch and whether its generation prompt opens the thinking.
"""

from __future__ import annotations

import codecs
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

THINK, MISTRAL, HARMONY = "think", "mistral", "harmony"
SYNTAXES = (THINK, MISTRAL, HARMONY)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
MARKERS = {THINK: (THINK_OPEN, THINK_CLOSE), MISTRAL: ("[THINK]", "[/THINK]")}  # open, close
CHANNEL, MESSAGE, END, START = "<|channel|>", "<|message|>", "<|end|>", "<|start|>"
THINKING_CHANNELS = ("analysis",)
_PROMPT_TAIL_TOKENS = 24  # prompt tokens decoded to see whether the prompt opened the thinking


@dataclasses.dataclass(frozen=True)
class ReasoningProfile:
    """How a model's chat template handles reasoning.

    Attributes:
        syntax: ``"think"``, ``"mistral"``, ``"harmony"`` or None (the template shows no reasoning syntax).
        has_switch: the template reads ``enable_thinking``.
        opens_on: the generation prompt ends inside an open ``<think>`` with thinking on (or no switch set).
        opens_off: the same with ``enable_thinking`` false.
    """

    syntax: str | None = None
    has_switch: bool = False
    opens_on: bool = False
    opens_off: bool = False

    def opens(self, enable_thinking: bool | None) -> bool:
        """Whether a reply rendered with this ``enable_thinking`` starts inside the thinking."""
        return self.opens_off if enable_thinking is False else self.opens_on

    def template_vars(self, enable_thinking: bool) -> dict[str, Any]:
        """The variables to render with: ``enable_thinking`` only for templates that read it."""
        return {"enable_thinking": bool(enable_thinking)} if self.has_switch else {}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> ReasoningProfile:
        """A profile from ``to_dict`` output; anything malformed gives the profile of a model without reasoning."""
        if not isinstance(data, dict) or data.get("syntax") not in (*SYNTAXES, None):
            return cls()
        return cls(data.get("syntax"), *(bool(data.get(k)) for k in ("has_switch", "opens_on", "opens_off")))


def detect_syntax(template_source: str) -> str | None:
    """The reasoning syntax a chat template writes or parses, from its source text."""
    if CHANNEL in template_source and "analysis" in template_source:
        return HARMONY
    return next((syntax for syntax, (_, close) in MARKERS.items() if close in template_source), None)


def profile_of(template_source: str, render_probe: Callable[..., str]) -> ReasoningProfile:
    """A chat template's ``ReasoningProfile``.

    Args:
        template_source: the template's text (its syntax and switch are read from it).
        render_probe: renders a one-message conversation with a generation prompt, with extra template variables
            as keyword arguments; a ``ValueError`` (``TemplateError``) counts as "does not open the thinking".
    """
    syntax, has_switch = detect_syntax(template_source), "enable_thinking" in template_source
    if syntax is None:
        return ReasoningProfile(None, has_switch)

    def opens(**extra: Any) -> bool:
        try:
            return prompt_opens_thinking(render_probe(**extra), syntax)
        except ValueError:
            return False

    on = opens(enable_thinking=True) if has_switch else opens()
    return ReasoningProfile(syntax, has_switch, on, opens(enable_thinking=False) if has_switch else on)


def prompt_opens_thinking(prompt_text: str, syntax: str | None) -> bool:
    """True when ``prompt_text`` ends inside an unclosed ``<think>`` (the reply starts by thinking)."""
    if syntax not in MARKERS:
        return False
    opening, closing = MARKERS[syntax]
    return prompt_text.rfind(opening) > prompt_text.rfind(closing)


@dataclasses.dataclass(frozen=True)
class Split:
    """A reply's text so far, split: what the model thought and what it answered (markers removed)."""

    thinking: str
    answer: str
    in_thinking: bool  # the reply is inside its thinking right now (no answer yet, or a new thought)


class ReasoningSplitter:
    """Splits streamed reply text into thinking and answer, holding back a marker split across pieces.

    Args:
        syntax: ``"think"``, ``"mistral"``, ``"harmony"`` or None (everything is answer).
        starts_in_thinking: the prompt opened the thinking (``ReasoningProfile.opens``).

    Attributes:
        thinking_tokens: how many of the tokens fed (``feed(text, n_tokens)``) were thinking. A token is thinking
            when the reply was inside its thinking before it or after it, or it added thinking text: the markers
            count with the thinking they open or close (also when split across tokens), a harmony header with the
            message it starts, and a
            ``</think>`` with no ``<think>`` makes every token before it thinking.
    """

    def __init__(self, syntax: str | None, starts_in_thinking: bool = False):
        if syntax not in (*SYNTAXES, None):
            raise ValueError(f"unknown reasoning syntax {syntax!r}; expected one of {', '.join(SYNTAXES)}")
        self.syntax = syntax
        self.thinking_tokens = 0
        self._tokens_seen = 0
        self._undecided = 0  # tokens of a harmony header or a marker not yet whole: counted with what follows
        self._thinking: list[str] = []
        self._answer: list[str] = []
        self._thinking_chars = 0
        self._pending = ""  # text not yet parsed: it may end with the start of a marker
        self._open, self._close = MARKERS.get(syntax, ("", ""))
        self._in_thinking = starts_in_thinking and syntax in MARKERS
        self._opened = self._in_thinking  # a <think> was seen (or the prompt opened one)
        self._reopened_all = False  # a </think> without <think> just made everything before it thinking
        self._header = syntax == HARMONY  # harmony: before a message's <|message|>
        self._header_text = ""
        self._channel = ""

    # -- feeding -------------------------------------------------------------------------------------------
    def feed(self, text: str, n_tokens: int = 0) -> None:
        """Add the next piece of generated text, which ``n_tokens`` tokens produced (0: do not count)."""
        was_thinking, chars = self._thinking_now(), self._thinking_chars
        self._pending += text
        self._parse(final=False)
        if n_tokens:
            # no text yet (a character or a space clean-up still pending) or all of it may be a marker: decided later
            held = self._header or len(self._pending) >= len(text)
            self._count(n_tokens, was_thinking, self._thinking_now() or self._thinking_chars > chars, held)

    def finish(self) -> None:
        """The reply ended: release text held back for a marker that never completed."""
        self._parse(final=True)

    def split(self) -> Split:
        """The thinking and the answer so far (held-back text excluded); the thinking without surrounding
        whitespace, the answer without the blank lines that follow a thought."""
        answer = "".join(self._answer)
        return Split("".join(self._thinking).strip(), answer.lstrip() if self._thinking else answer,
                     self._thinking_now())

    def _thinking_now(self) -> bool:
        if self.syntax == HARMONY:
            return not self._header and self._channel in THINKING_CHANNELS
        return self._in_thinking

    def _count(self, n_tokens: int, was_thinking: bool, thinking: bool, held: bool) -> None:
        self._tokens_seen += n_tokens
        if self._reopened_all:
            self.thinking_tokens, self._reopened_all = self._tokens_seen, False
        elif was_thinking:  # (a marker that ends the thinking counts with it)
            self.thinking_tokens += n_tokens
        elif held:
            self._undecided += n_tokens
        else:
            if thinking:
                self.thinking_tokens += n_tokens + self._undecided
            self._undecided = 0

    def _parse(self, final: bool) -> None:
        if self.syntax in MARKERS:
            self._parse_think(final)
        elif self.syntax == HARMONY:
            self._parse_harmony(final)
        else:
            self._append(self._answer, self._pending)
            self._pending = ""

    def _append(self, part: list[str], text: str) -> None:
        if text:
            part.append(text)
            if part is self._thinking:
                self._thinking_chars += len(text)

    # -- <think> ... </think>, [THINK] ... [/THINK] ------------------------------------------------------------------
    def _parse_think(self, final: bool) -> None:
        while self._pending:
            marker = self._close if self._in_thinking else self._open
            at = self._pending.find(marker)
            if not self._in_thinking and not self._opened:
                close = self._pending.find(self._close)
                if close >= 0 and (at < 0 or close < at):
                    self._close_unopened(close)
                    continue
            if at < 0:
                keep = 0 if final else _partial_marker(self._pending, (marker, self._close))
                self._emit(self._pending[:len(self._pending) - keep])
                self._pending = self._pending[len(self._pending) - keep:]
                return
            self._emit(self._pending[:at])
            self._pending = self._pending[at + len(marker):]
            if not self._in_thinking and self._thinking:
                self._append(self._thinking, "\n\n")  # thoughts of one reply, one after the other
            self._in_thinking = not self._in_thinking
            self._opened = True

    def _close_unopened(self, close: int) -> None:
        """A ``</think>`` with no ``<think>``: the prompt opened it, so everything before it was thinking."""
        earlier, self._answer = self._answer, []
        for text in (*earlier, self._pending[:close]):
            self._append(self._thinking, text)
        self._pending = self._pending[close + len(self._close):]
        self._opened = self._reopened_all = True

    def _emit(self, text: str) -> None:
        self._append(self._thinking if self._in_thinking else self._answer, text)

    # -- harmony -------------------------------------------------------------------------------------------
    def _parse_harmony(self, final: bool) -> None:
        markers = (CHANNEL, MESSAGE, END, START)
        while self._pending:
            at, marker = _first_marker(self._pending, markers)
            if marker is None:
                keep = 0 if final else _partial_marker(self._pending, markers)
                self._harmony_text(self._pending[:len(self._pending) - keep])
                self._pending = self._pending[len(self._pending) - keep:]
                return
            self._harmony_text(self._pending[:at])
            self._pending = self._pending[at + len(marker):]
            if marker == CHANNEL:
                self._header, self._header_text = True, ""
            elif marker == MESSAGE:
                words = self._header_text.split()
                self._header, self._channel = False, words[0] if words else ""
            else:  # <|end|> or <|start|>: the message is over; a header follows
                if self._channel in THINKING_CHANNELS and not self._header and self._thinking:
                    self._append(self._thinking, "\n\n")
                self._header, self._header_text, self._channel = True, "", ""

    def _harmony_text(self, text: str) -> None:
        if self._header:  # "assistant", "analysis", "commentary to=functions.f <|constrain|>json"
            self._header_text += text
        else:
            self._append(self._thinking if self._channel in THINKING_CHANNELS else self._answer, text)


def _first_marker(text: str, markers: Sequence[str]) -> tuple[int, str | None]:
    found = [(text.find(m), m) for m in markers if m in text]
    return min(found) if found else (-1, None)


def _partial_marker(text: str, markers: Iterable[str]) -> int:
    """How many characters at the end of ``text`` could be the start of one of ``markers``."""
    longest = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:n]):
                longest = n
                break
    return longest


# -- token counts ------------------------------------------------------------------------------------------
def count_thinking_tokens(pieces: Iterable[str], syntax: str | None, starts_in_thinking: bool = False) -> int:
    """How many of a reply's tokens were thinking, given each token's decoded text in order (see
    ``ReasoningSplitter.thinking_tokens``)."""
    splitter = ReasoningSplitter(syntax, starts_in_thinking)
    for piece in pieces:
        splitter.feed(piece, 1)
    return splitter.thinking_tokens


def thinking_stats(tokenizer: Any, profile: ReasoningProfile, sequence: Sequence[int], n_generated: int) -> dict:
    """``{"thinking_tokens": n}`` for a finished reply (``{}`` when the model has no reasoning syntax).

    Args:
        tokenizer: the model's ``engine.tokenizer.Tokenizer``.
        profile: the model's ``ReasoningProfile`` (``ChatTemplate.reasoning``).
        sequence: the prompt's token ids followed by the reply's.
        n_generated: how many of ``sequence``'s last ids are the reply.
    """
    if profile.syntax is None or n_generated <= 0 or n_generated > len(sequence):
        return {}
    prompt = sequence[:len(sequence) - n_generated]
    opened = prompt_opens_thinking(tokenizer.decode(prompt[-_PROMPT_TAIL_TOKENS:]), profile.syntax)
    # each token's own text (no space clean-up, which would hold text back to a later token), as streamed
    utf8 = codecs.getincrementaldecoder("utf-8")("replace")
    pieces = [utf8.decode(tokenizer.token_to_bytes(token, skip_special=True)) for token in sequence[len(prompt):]]
    pieces[-1] += utf8.decode(b"", final=True)
    return {"thinking_tokens": count_thinking_tokens(pieces, profile.syntax, opened)}
