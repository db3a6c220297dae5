"""Constrained decoding with llguidance: ``response_format`` JSON schemas, and the tool call ``tool_choice``
requires, enforced token by token.

The grammar library sees the model's vocabulary as token bytes (control tokens marked with a leading 0xFF
byte, llguidance's convention, so no grammar can produce them as text); each step it masks the tokens that
cannot continue a valid document, and the request's own sampler picks among the rest.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence

import llguidance
import llguidance.numpy as llg_numpy
import numpy as np

from ..tokenizer import Tokenizer


class _VocabView:
    """What llguidance's TokenizerWrapper reads from a tokenizer."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.tokens, self.special_token_ids = [], []
        for tid in range(tokenizer.n_vocab):
            piece = tokenizer.token_to_bytes(tid, skip_special=True)
            if not piece and tokenizer.token_to_bytes(tid):
                piece = b"\xff" + tokenizer.token_to_bytes(tid)  # a control token
                self.special_token_ids.append(tid)
            self.tokens.append(piece)

    def __call__(self, text: bytes) -> list[int]:
        return self._tokenizer.encode(text.decode("utf-8", "replace"), add_special=False, parse_special=False)


@functools.lru_cache(maxsize=4)
def grammar_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """The model's vocabulary for llguidance (built once per tokenizer)."""
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_VocabView(tokenizer)))


def json_schema_grammar(schema: dict | None) -> str:
    """A grammar for JSON documents matching ``schema`` (any JSON object when None).

    Raises:
        ValueError: the schema is not one llguidance can compile.
    """
    spec = schema if schema is not None else {"type": "object"}
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(spec), defaults={"whitespace_flexible": False})
    except (ValueError, TypeError, RuntimeError) as e:
        raise ValueError(f"invalid JSON schema: {e}") from e


def tool_call_grammar(tools: list[dict], name: str | None, template_source: str) -> str:
    """A grammar for one call of a tool in ``tools`` (of ``name`` when given), written in the syntax the model's
    chat template uses: Qwen/Hermes ``<tool_call>{...}</tool_call>``, else a bare JSON object
    ``{"name": ..., "arguments": {...}}`` (which ``tool_calls.parse_tool_calls`` reads for every family).

    Raises:
        ValueError: ``name`` is not one of the tools, or a tool's parameters are not a schema llguidance compiles.
    """
    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    if not chosen:
        raise ValueError(f"tool_choice names '{name}', which is not one of the tools")
    calls = [{"type": "object", "properties": {"name": {"const": f["name"]},
                                               "arguments": f.get("parameters") or {"type": "object"}},
              "required": ["name", "arguments"], "additionalProperties": False} for f in chosen]
    schema = json.dumps(calls[0] if len(calls) == 1 else {"anyOf": calls})
    body = 'start: "<tool_call>\\n" call "\\n</tool_call>"' if "<tool_call>" in template_source else "start: call"
    try:
        grammar = llguidance.LLMatcher.grammar_from_lark(f"{body}\ncall: %json {schema}")
    except (ValueError, TypeError, RuntimeError) as e:
        raise ValueError(f"invalid tool parameters schema: {e}") from e
    return grammar


class ConstrainedSampler:
    """Wraps a sampler: tokens the grammar does not allow get no probability, and each chosen token advances
    the grammar.

    Args:
        sample: the request's own sampler, ``(logits, history) -> (token, logprob)``.
        tokenizer: the model's tokenizer.
        grammar: a grammar from ``json_schema_grammar`` or ``tool_call_grammar``.

    Raises:
        ValueError: the grammar does not compile against this vocabulary.
    """

    def __init__(self, sample, tokenizer: Tokenizer, grammar: str):
        lltok = grammar_tokenizer(tokenizer)
        error = llguidance.LLMatcher.validate_grammar(grammar, lltok)
        if error:
            raise ValueError(f"invalid JSON schema: {error}")
        self.sample, self.n_vocab = sample, tokenizer.n_vocab
        self.matcher = llguidance.LLMatcher(lltok, grammar, log_level=0)
        self.mask = llg_numpy.allocate_token_bitmask(1, lltok.vocab_size)  # (1, ceil(vocab / 32)) int32

    def __call__(self, logits: np.ndarray, history: Sequence[int]) -> tuple[int, float]:
        llg_numpy.fill_next_token_bitmask(self.matcher, self.mask, 0)
        allowed = np.unpackbits(self.mask.view(np.uint8), bitorder="little")[:logits.shape[-1]].astype(bool)
        masked = np.where(allowed, logits, -np.inf).astype(logits.dtype, copy=False)
        token, logprob = self.sample(masked, history)
        if not self.matcher.consume_token(int(token)):
            raise ValueError(f"the grammar refused token {token}: {self.matcher.get_error()}")
        return token, logprob
