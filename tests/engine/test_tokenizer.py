"""Tokenizer parity with llama.cpp (golden ids and text), streaming decode, and refusal of bad metadata."""

from __future__ import annotations

import functools
import json
import random
import types
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from engine.gguf_file import ModelFormatError, read_gguf
from engine.pretokenizer import PreTokenizer
from engine.pretokenizer_rules import KINDS
from engine.tokenizer import IncrementalDecoder, Tokenizer, clean_up_spaces
from engine.unicode_classes import CATEGORY_MASK, WHITESPACE, WHITESPACE_CODEPOINTS, class_table
from tests.model_store import model_path

REFERENCE = Path(__file__).parents[1] / "reference"
MODELS = ("smollm2", "gemma3", "qwen25coder")


@functools.cache
def tokenizer(name: str) -> Tokenizer:
    return Tokenizer.from_gguf(read_gguf(model_path(name)))


@functools.cache
def reference(kind: str, name: str) -> dict:
    return json.loads((REFERENCE / f"{kind}_{name}.json").read_text(encoding="utf-8"))


def _params(kind: str, key: str) -> list:
    return [pytest.param(name, i, id=f"{name}-{i}") for name in MODELS
            for i in range(len(reference(kind, name)[key]))]


# -- parity with llama.cpp on the real test models ---------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name,index", _params("public", "tokenize"))
def test_public_tokenize_matches_llama_cpp(name: str, index: int) -> None:
    case, tok = reference("public", name)["tokenize"][index], tokenizer(name)
    assert tok.encode(case["text"]) == case["ids"]
    assert tok.encode(case["text"], parse_special=True) == case["ids_special"]
    assert tok.decode(tok.encode(case["text"], add_special=False)) == case["detok_roundtrip"]


@pytest.mark.slow
@pytest.mark.parametrize("name,index", _params("public", "generate"))
def test_public_prompts_match_llama_cpp(name: str, index: int) -> None:
    case = reference("public", name)["generate"][index]
    assert tokenizer(name).encode(case["prompt"], add_special=True, parse_special=True) == case["prompt_ids"]


@pytest.mark.slow
@pytest.mark.parametrize("name,index", _params("extra_tokenize", "cases"))
def test_extra_cases_match_llama_cpp(name: str, index: int) -> None:
    case, tok = reference("extra_tokenize", name)["cases"][index], tokenizer(name)
    assert tok.encode(case["text"]) == case["ids"]
    assert tok.encode(case["text"], parse_special=True) == case["ids_special"]
    assert tok.decode(tok.encode(case["text"], add_special=False)) == case["detok_roundtrip"]
    assert tok.decode(case["ids_special"]) == case["detok_special"]
    assert tok.decode(case["ids_special"], skip_special=True) == case["detok_skip"]


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_special_ids_and_flags_match_llama_cpp(name: str) -> None:
    facts, tok = reference("extra_tokenize", name), tokenizer(name)
    assert tok.n_vocab == facts["n_vocab"]
    assert (tok.bos_id, tok.eos_id) == (facts["bos_id"], facts["eos_id"])
    assert (tok.add_bos, tok.add_eos) == (facts["add_bos"], facts["add_eos"])
    assert tok.eog_ids == frozenset(facts["eog_ids"])
    assert tok.eos_id in tok.eog_ids and tok.is_special(tok.eos_id)


def _all_id_lists(name: str) -> list[list[int]]:
    public = reference("public", name)
    return ([c["ids_special"] for c in public["tokenize"]] + [c["prompt_ids"] for c in public["generate"]]
            + [c["greedy_ids"] for c in public["generate"]]
            + [c["ids_special"] for c in reference("extra_tokenize", name)["cases"]])


@pytest.mark.slow
@pytest.mark.parametrize("skip_special", [False, True])
@pytest.mark.parametrize("name", MODELS)
def test_streaming_decode_equals_full_decode(name: str, skip_special: bool) -> None:
    tok = tokenizer(name)
    for ids in _all_id_lists(name):
        stream = IncrementalDecoder(tok, skip_special)
        pieces = [stream.add(i) for i in ids] + [stream.flush()]
        full = tok.decode(ids, skip_special=skip_special)
        assert "".join(pieces) == full
        if "\ufffd" not in full:  # a split multi-byte character would surface as U+FFFD
            assert not any("\ufffd" in p for p in pieces)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_streaming_holds_back_a_character_split_across_tokens(name: str) -> None:
    tok = tokenizer(name)
    held = 0
    for emoji in ("🫨", "👩🏽‍💻", "𰻞", "🏴‍☠️"):
        ids = tok.encode(emoji, add_special=False)
        stream = IncrementalDecoder(tok)
        pieces = [stream.add(i) for i in ids] + [stream.flush()]
        assert "".join(pieces) == emoji
        held += sum(p == "" for p in pieces[:-1])
    assert held > 0  # every model spells some of these with byte tokens


@pytest.mark.slow
def test_decoder_reuse_after_flush_starts_a_new_stream() -> None:
    tok = tokenizer("gemma3")
    ids = tok.encode("Hello 🙂 world")
    stream = IncrementalDecoder(tok, skip_special=True)
    first = "".join(stream.add(i) for i in ids) + stream.flush()
    second = "".join(stream.add(i) for i in ids) + stream.flush()
    assert first == second == "Hello 🙂 world"


@pytest.mark.slow
def test_gemma_renders_or_skips_control_tokens() -> None:
    tok = tokenizer("gemma3")
    ids = tok.encode("<start_of_turn>user\nhi<end_of_turn>", parse_special=True)
    assert ids[:2] == [tok.bos_id, tok.encode("<start_of_turn>", False, True)[0]]
    assert tok.decode(ids) == "<bos><start_of_turn>user\nhi<end_of_turn>"
    assert tok.decode(ids, skip_special=True) == "user\nhi"
    assert tok.token_to_bytes(ids[1]) == b"<start_of_turn>" and tok.token_to_bytes(ids[1], skip_special=True) == b""
    assert tok.token_text(tok.encode(" hi", add_special=False)[0]) == "\u2581hi"


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_out_of_vocabulary_ids_are_refused(name: str) -> None:
    tok = tokenizer(name)
    for bad in (-1, tok.n_vocab, 10**9):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            tok.decode([1, bad])
        with pytest.raises(ValueError, match="outside the vocabulary"):
            IncrementalDecoder(tok).add(bad)
    with pytest.raises(ValueError, match="not an integer"):
        tok.decode(["7"])


# -- small hand-made vocabularies --------------------------------------------------------------------------
def _load(metadata: dict) -> Tokenizer:
    return Tokenizer.from_gguf(types.SimpleNamespace(metadata=metadata))


def _byte_level_alphabet() -> list[str]:
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = [b for b in range(256) if b not in printable]
    table = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(extra)}
    return [table[b] for b in range(256)]


def _bpe_metadata(pre: str = "gpt-2", merges: tuple[str, ...] = ("Ġ t", "h e", "Ġt he", "i n", "Ġ a")) -> dict:
    tokens = _byte_level_alphabet() + ["Ġt", "he", "Ġthe", "in", "Ġa", "<|endoftext|>", "<|user|>"]
    types_ = [1] * (len(tokens) - 2) + [3, 4]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": np.array(types_, np.int32), "tokenizer.ggml.merges": list(merges),
            "tokenizer.ggml.eos_token_id": len(tokens) - 2}


def _spm_metadata(**extra) -> dict:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [
        "\u2581", "a", "b", "c", "ab", "bc", "\u2581a", "\u2581ab", "abc", "<ctl>"]
    scores = [0.0] * 259 + [-1.0, -2.0, -2.0, -2.0, -3.0, -1.5, -1.0, -0.5, -0.2, 0.0]
    types_ = [2, 3, 3] + [6] * 256 + [1] * 9 + [3]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": np.array(scores, np.float32),
            "tokenizer.ggml.token_type": np.array(types_, np.int32), **extra}


# Expected ids in the tests below were checked against llama.cpp (llama-cpp-python 0.3.36) on the same
# vocabularies written as GGUF files.
def test_spm_merges_by_score_with_byte_fallback_and_space_prefix() -> None:
    tok = _load(_spm_metadata())
    ids = tok.encode("abc ab z")
    # "▁a" (-1.0) merges first, then "▁ab" (-0.5) takes the "b" that "bc" (-1.5) wanted; "z" has no token
    assert [tok.token_text(i) for i in ids] == ["<s>", "\u2581ab", "c", "\u2581ab", "\u2581", "<0x7A>"]
    assert tok.decode(ids) == "<s> abc ab z"  # the prefix space stays after a rendered BOS
    assert tok.decode(ids, skip_special=True) == " abc ab z"
    assert tok.decode(ids[1:]) == "abc ab z"  # ... and goes when the text starts the sequence
    assert tok.encode("", add_special=False) == [] and tok.encode("") == [1]
    assert [tok.token_text(i) for i in tok.encode(" ", add_special=False)] == ["\u2581", "\u2581"]


def test_spm_control_tokens_split_text_and_restart_the_space_prefix() -> None:
    tok = _load(_spm_metadata())
    parsed = tok.encode("a<ctl>a", add_special=False, parse_special=True)
    assert [tok.token_text(i) for i in parsed] == ["\u2581a", "<ctl>", "\u2581a"]
    plain = tok.encode("a<ctl>a", add_special=False)
    assert [tok.token_text(i) for i in plain] == ["\u2581a", "<0x3C>", "c", "<0x74>", "<0x6C>", "<0x3E>", "a"]
    assert tok.decode(tok.encode("a<ctl>a", parse_special=True)) == "<s> a<ctl> a"
    assert tok.decode(tok.encode("a<ctl>a", parse_special=True), skip_special=True) == " a a"


def test_spm_without_space_prefix_or_bos() -> None:
    tok = _load(_spm_metadata(**{"tokenizer.ggml.add_space_prefix": False, "tokenizer.ggml.add_bos_token": False}))
    assert [tok.token_text(i) for i in tok.encode("abc ab z")] == ["abc", "\u2581ab", "\u2581", "<0x7A>"]
    assert tok.decode(tok.encode("abc ab z")) == "abc ab z"


def test_byte_level_bpe_merges_and_special_tokens() -> None:
    tok = _load(_bpe_metadata())
    text = "the thin<|user|> a<|endoftext|>"
    spelled = ["<", "|", "e", "n", "d", "o", "f", "t", "e", "x", "t", "|", ">"]
    head = ["t", "he", "\u0120t", "h", "in", "<|user|>", "\u0120a"]  # user-defined tokens always match
    assert [tok.token_text(i) for i in tok.encode(text)] == head + spelled
    assert [tok.token_text(i) for i in tok.encode(text, parse_special=True)] == head + ["<|endoftext|>"]
    assert tok.decode(tok.encode(text, parse_special=True)) == text
    assert tok.decode(tok.encode(text, parse_special=True), skip_special=True) == "the thin<|user|> a"
    assert tok.eos_id in tok.eog_ids and tok.is_special(tok.eos_id)


def test_byte_level_decode_cleans_spaces_like_llama_cpp() -> None:
    assert clean_up_spaces(b"Hello , world . Is it ? Yes !") == b"Hello, world. Is it? Yes!"
    assert clean_up_spaces(b"a ' b ' ' c") == b"a'b'' c"
    assert clean_up_spaces(b"I 'm he 's we 're they 've don 't I 'll") == b"I'm he's we're they've don 't I 'll"
    tok = _load(_bpe_metadata())  # gpt-2 cleans up; smollm / qwen2 do not
    assert tok.decode(tok.encode("Hi , you 're here .")) == "Hi, you're here."
    assert _load(_bpe_metadata(pre="qwen2")).decode(tok.encode("Hi , you 're here .")) == "Hi , you 're here ."


def test_streaming_decode_with_space_clean_up_equals_full_decode() -> None:
    tok = _load(_bpe_metadata())
    alphabet = [tok.encode(ch, add_special=False)[0] for ch in " ' ?!.,smtrevld\n"] + [tok.eos_id]
    alphabet += tok.encode("é🙂", add_special=False)  # multi-byte characters split over byte tokens
    rng = random.Random(1)
    for _ in range(300):
        ids = [rng.choice(alphabet) for _ in range(rng.randint(0, 25))]
        for skip in (False, True):
            stream = IncrementalDecoder(tok, skip)
            streamed = "".join(stream.add(i) for i in ids) + stream.flush()
            assert streamed == tok.decode(ids, skip_special=skip), ids


def test_real_gguf_file_loads(tiny_model_path: Path) -> None:
    tok = Tokenizer.from_gguf(read_gguf(tiny_model_path))
    text = "Hello, world! 123 <|im_start|>"
    assert tok.decode(tok.encode(text, add_special=False)) == text


# -- pre-tokenizers ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("pre,text,words", [
    ("llama-bpe", "12345 don'T  go\n\n x", ["123", "45", " don", "'T", " ", " go", "\n\n", " x"]),
    ("qwen2", "12345 A1", ["1", "2", "3", "4", "5", " A", "1"]),
    ("gpt-2", "it's  ok?!", ["it", "'s", " ", " ok", "?!"]),
    ("smollm", "x2024 y", ["x", "2", "0", "2", "4", " y"]),
    ("gpt-4o", "HelloWorld's ABCdef", ["Hello", "World's", " ABCdef"]),
    ("deepseek-llm", "ab 12\n", ["ab", " ", "12", "\n"]),
    ("falcon", "a1234b", ["a", "123", "4", "b"]),
])
def test_pretokenizer_splits(pre: str, text: str, words: list[str]) -> None:
    assert PreTokenizer(pre).split(text) == words


@pytest.mark.parametrize("pre", sorted(KINDS))
def test_every_pretokenizer_splits_losslessly(pre: str) -> None:
    text = "Hi  there!\n\n\tIt's 2024-01-31, 12345 €, naïve 日本語 🙂‍↔️ \u3000x  "
    words = PreTokenizer(pre).split(text)
    assert "".join(words) == text and all(words)


def test_unicode_classes_agree_with_python_where_python_knows_the_character() -> None:
    table = class_table()
    group = {"N": 2, "L": 4, "Z": 8, "M": 16, "P": 32, "S": 64, "C": 128}
    for cp in range(0x30000):
        category = unicodedata.category(chr(cp))
        if category != "Cn":
            assert table[cp] & CATEGORY_MASK == group[category[0]], hex(cp)
        assert bool(table[cp] & WHITESPACE) == (cp in WHITESPACE_CODEPOINTS)
    assert table[0x1FA77] & CATEGORY_MASK == group["S"]  # 🩷, new in Unicode 15, unknown to Python 3.11


# -- bad metadata ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change,message", [
    ({"tokenizer.ggml.model": None}, "tokenizer.ggml.model"),
    ({"tokenizer.ggml.model": "t5"}, "unsupported tokenizer model"),
    ({"tokenizer.ggml.pre": "kimi-k2"}, "unsupported pre-tokenizer"),
    ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.tokens": []}, "empty"),
    ({"tokenizer.ggml.tokens": ["a", "b", "a"]}, "duplicate"),
    ({"tokenizer.ggml.tokens": ["a", 3]}, "not an array of strings"),
    ({"tokenizer.ggml.merges": None}, "merges"),
    ({"tokenizer.ggml.token_type": np.ones(3, np.int32)}, "entries for"),
    ({"tokenizer.ggml.token_type": np.ones(300, np.float32)}, "wrong type"),
    ({"tokenizer.ggml.eos_token_id": 10**6}, "outside the vocabulary"),
    ({"tokenizer.ggml.bos_token_id": -1}, "outside the vocabulary"),
    ({"tokenizer.ggml.padding_token_id": "3"}, "not an integer"),
    ({"tokenizer.ggml.pre": "chatglm-bpe", "tokenizer.ggml.add_bos_token": True}, "add_bos_token is true"),
    ({"tokenizer.ggml.add_eos_token": "yes"}, "not a boolean"),
])
def test_bad_bpe_metadata_is_refused(change: dict, message: str) -> None:
    metadata = _bpe_metadata()
    for key, value in change.items():
        if value is None:
            del metadata[key]
        else:
            metadata[key] = value
    with pytest.raises(ModelFormatError, match=message):
        _load(metadata)


def test_bad_spm_metadata_is_refused() -> None:
    with pytest.raises(ModelFormatError, match="scores has 3 entries"):
        _load(_spm_metadata(**{"tokenizer.ggml.scores": np.zeros(3, np.float32)}))
    with pytest.raises(ModelFormatError, match="unknown_token_id"):
        _load(_spm_metadata(**{"tokenizer.ggml.unknown_token_id": 5000}))
